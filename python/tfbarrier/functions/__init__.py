"""``run`` and ``apply``: the user's own function in every worker of a barrier stage (calls.py, the driver's side),
as the job kinds the training processes execute (jobs.py)."""
