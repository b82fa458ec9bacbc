"""The SLURM scheduler: sbatch, srun, squeue and scancel, read and written by pure helpers."""
