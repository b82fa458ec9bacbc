"""One module per benchmark row; each runs alone as python -m bench.rows.NAME [--quick] [--out FILE]."""
