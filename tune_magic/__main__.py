import sys

from tune_magic.ui.cli import main

sys.exit(main())
