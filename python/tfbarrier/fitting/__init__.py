"""The fit kind of job: FitJob (job.py: its task's side), and the training process's toolkit that every
exchange's trainer shares (training.py: tfbarrier's callbacks, the chief's output, the model's fit;
evaluation.py, pacing.py, optimizers.py, saving.py, checkpoints.py). How the gradients travel is the
exchange's (tfbarrier.exchange)."""
