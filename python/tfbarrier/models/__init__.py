"""The model as it travels: a config and a weights file (model_spec.py; the weights' format weights_file.py;
keras_compat.py for Keras 3 configs rebuilt as tf_keras), a Keras 3 model that trains natively (native_model.py),
a KerasHub preset loaded where it trains (presets.py), and what it needs of a host's memory (memory.py)."""
