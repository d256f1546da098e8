"""The model as it travels: a config and a weights file (model_spec.py, keras_compat.py for Keras 3 configs
rebuilt as tf_keras), a Keras 3 model that trains natively (native_model.py), what it needs of a host's
memory (memory.py), and how predict's model reaches the executors (scoring_models.py)."""
