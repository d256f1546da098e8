"""The data of a job: which layout the ``features=`` and ``label=`` of a call make of a DataFrame
(layouts.py, features.py), how a shard holds the rows and streams them into TensorFlow (stored_forms.py,
shards.py, images.py), and the sources the tasks read themselves (parquet_source.py)."""
