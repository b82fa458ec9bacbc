"""Where jobs run: one module or package per scheduler (local processes, SLURM)."""
