"""``predict`` and ``predict_local``: a model's scores (or, for a causal LM, its text) as a lazy column of a
DataFrame, computed on the executors by an Arrow iterator UDF (inference.py; generation.py for text), the model
shipped once per application and loaded once per Python worker (scoring_models.py). No barrier stage."""
