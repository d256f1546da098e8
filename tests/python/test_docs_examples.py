"""The guides' blocks that need Spark, run on the suite's local Spark and tiny data, as a reader runs them.

A block marked ``<!-- with spark: SCENE -->`` (tests/python/test_docs.py reads the markers) runs here with its
page's other runnable blocks before it, page by page in one namespace, in a temporary directory. ``spark`` is the
suite's session and ``tfbarrier`` the package; the scene gives what the block takes as already in a reader's hands, tiny:

- ``digits``: ``df`` (the 8x8 digits: ``pixels``, an array of 64 floats, and ``digit``), ``held_out_df``,
  ``model`` (a compiled Keras CNN of input (8, 8, 1)), and /data/digits.parquet;
- ``fitted``: those and ``result``, that model fitted on them;
- ``tracking``: the digits, and ``build_model`` and ``params`` for ``tune``;
- ``optuna``: the digits, and ``make_cnn(learning_rate)``;
- ``embeddings``: the digits, ``base_model`` (a layer named ``dense``) and ``head_model`` (trained on its output);
- ``digit-images``: /data/digits/<class>/<n>.png;
- ``iris``: ``df`` (``sl``, ``sw``, ``pl``, ``pw`` and an integer ``species``), ``model``, ``model_a``, ``model_b``
  and ``scaled_df`` (a ``features`` vector);
- ``named-columns``: ``df`` and ``model`` of three inputs and two outputs (tests/python/test_named_inputs.py's);
- ``token-lm``: ``df`` of token ids (``ids``, ``mask``, ``next_ids``, ``label_mask``) and ``lm``, a causal LM;
- ``preset-tokens``: a small causal LM saved as a preset at /data/presets/llama_1b, and ``df`` of its token ids;
- ``reviews``: a small BERT's ``backbone`` and ``preprocessor``, ``reviews_df``, ``held_out_df``, ``new_reviews_df``;
- ``notes``: a small GPT-2's ``backbone`` and ``tokenizer``, and ``notes_df`` (a ``text`` column);
- ``prompts``: ``prompts_df`` (a ``prompt`` column);
- ``vectors``: ``df`` (``x``, an array, and ``y``) and an Adam-compiled ``model``;
- ``run``: ``build_and_compile()`` and ``make_dataset()``, for a function run() runs.

Absolute paths under /data and /shared in a block are the temporary directory's ``data`` and ``shared``: the only
change made to a block's text. A block that fails fails its page's test, naming the block."""

import os
import re
import textwrap

import keras
import numpy as np
import pandas as pd
import pytest
from conftest import digits_cnn, digits_frames, partitioned
from test_docs import ON_SPARK, PYTHON_BLOCKS, RUN_HERE

import tfbarrier

ROWS, HELD_OUT = 128, 32
PAGES = sorted({block.page for block in ON_SPARK})
RAN = []
PATHS = re.compile(r"""(?P<quote>["'])/(?P<root>data|shared)/""")


def runnable(page):
    """The page's blocks a reader runs, in order: those that need no Spark, and those that run on it."""
    return sorted((block for block in RUN_HERE + ON_SPARK if block.page == page), key=lambda block: block.line)


def with_paths_in(code, root):
    return PATHS.sub(lambda m: f"{m['quote']}{root}/{m['root']}/", code)


# ---- the scenes ---------------------------------------------------------------------------------------------------
# Each takes the Spark session and the page's directory and returns the names it gives. Functions a block ships
# to the executors are defined by source in the page's namespace (as a reader defines them), so that cloudpickle
# sends them by value, not as a reference to this module, which no executor imports.

def compiled(model, learning_rate=0.01):
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


_cache = {}


def cached(name, make):
    if name not in _cache:
        _cache[name] = make()
    return _cache[name]


def digits(spark, root):
    def frames():
        train, held_out = digits_frames()
        return (spark.createDataFrame(train.iloc[:ROWS]).repartition(2).cache(),
                spark.createDataFrame(held_out.iloc[:HELD_OUT]).cache())

    df, held_out_df = cached("digits", frames)
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    df.write.mode("overwrite").parquet(os.path.join(root, "data", "digits.parquet"))
    return {"df": df, "held_out_df": held_out_df, "model": digits_cnn()}


def fitted(spark, root):
    given = digits(spark, root)
    given["result"] = cached("fitted", lambda: tfbarrier.fit(given["df"], digits_cnn(), features="pixels",
                                                              label="digit", epochs=2, num_workers=2, verbose=0))
    return given


BUILD_MODEL = '''
def build_model(params):
    import keras

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(params["learning_rate"]), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

params = {"learning_rate": [1e-2, 1e-3]}
'''


def tracking(spark, root):
    return {**digits(spark, root), **defined(BUILD_MODEL)}


def optuna(spark, root):
    return {**digits(spark, root), **defined('''
def make_cnn(learning_rate):
    import keras

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
''')}


def embeddings(spark, root):
    base = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu", name="dense"),
                             keras.layers.Dense(10)])
    head = keras.Sequential([keras.Input((16,)), keras.layers.Dense(10)])
    return {**digits(spark, root), "base_model": compiled(base), "head_model": compiled(head)}


def digit_images(spark, root):
    from PIL import Image

    train, _ = digits_frames()
    for n, (pixels, digit) in enumerate(zip(train["pixels"][:48], train["digit"][:48])):
        os.makedirs(os.path.join(root, "data", "digits", str(digit)), exist_ok=True)
        image = Image.fromarray((np.asarray(pixels).reshape(8, 8) * 255).astype("uint8"), mode="L")
        image.save(os.path.join(root, "data", "digits", str(digit), f"{n}.png"))
    return {}


def iris(spark, root):
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    frame = pd.DataFrame(x, columns=["sl", "sw", "pl", "pw"]).assign(species=y.astype("int64"))
    df = spark.createDataFrame(frame.sample(frac=1.0, random_state=0)).repartition(2).cache()
    assembled = VectorAssembler(inputCols=["sl", "sw", "pl", "pw"], outputCol="raw").transform(df)
    scaled_df = StandardScaler(inputCol="raw", outputCol="features").fit(assembled).transform(assembled)

    def classifier(units):
        return compiled(keras.Sequential([keras.Input((4,)), keras.layers.Dense(units, activation="relu"),
                                          keras.layers.Dense(3)]), learning_rate=0.05)

    return {"df": df, "scaled_df": scaled_df, "model": classifier(8), "model_a": classifier(4),
            "model_b": classifier(8)}


def named_columns(spark, root):
    import test_named_inputs as named

    frame = named.frame_of(named.columns(2 * named.ROWS_PER_WORKER, seed=1))
    return {"df": partitioned(spark, frame, lambda i: i % 2, 2), "model": named.multi_model()}


def token_lm(spark, root):
    import test_sequence_labels as sequence

    data = sequence.sequences(2 * sequence.ROWS_PER_WORKER, seed=2)
    frame = pd.DataFrame({"ids": list(data["ids"]), "mask": list(data["mask"]), "next_ids": list(data["labels"]),
                          "label_mask": list(data["weights"])})
    return {"df": partitioned(spark, frame, lambda i: i % 2, 2), "lm": sequence.causal_lm()}


def preset_tokens(spark, root):
    import test_sequence_labels as sequence

    path = os.path.join(root, "data", "presets", "llama_1b")
    if not os.path.exists(path):  # the page's first block of this scene saves it; the next use it
        sequence.causal_lm().save_to_preset(path)
    frame = sequence.frame_of(sequence.sequences(2 * sequence.ROWS_PER_WORKER, seed=3))
    return {"df": partitioned(spark, frame, lambda i: i % 2, 2)}


def reviews(spark, root):
    import keras_hub
    import test_text as text

    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=text.VOCABULARY, lowercase=True)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(text.VOCABULARY), num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
    return {"backbone": backbone,
            "preprocessor": keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=8),
            "reviews_df": partitioned(spark, text.reviews(32, seed=1), lambda i: i % 2, 2),
            "held_out_df": spark.createDataFrame(text.reviews(8, seed=2)),
            "new_reviews_df": spark.createDataFrame(text.reviews(8, seed=3)[["text"]])}


def notes(spark, root):
    import keras_hub
    import test_text as text

    tokenizer = text.causal_lm().preprocessor.tokenizer
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, max_sequence_length=128)
    return {"backbone": backbone, "tokenizer": tokenizer,
            "notes_df": partitioned(spark, text.phrases(32, seed=1), lambda i: i % 2, 2)}


def prompts(spark, root):
    return {"prompts_df": spark.createDataFrame(pd.DataFrame({"prompt": ["ab", "cde", "fg", "h"]}))}


def vectors(spark, root):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16)).astype("float32")
    frame = pd.DataFrame({"x": list(x), "y": x.sum(axis=1)})
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return {"df": partitioned(spark, frame, lambda i: i % 2, 2), "model": model}


def run(spark, root):
    return defined('''
def build_and_compile():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model

def make_dataset():
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1))).batch(16)
''')


def defined(source):
    namespace = {"__name__": "docs:given"}
    exec(compile(textwrap.dedent(source), "<the scene>", "exec"), namespace)
    return {name: value for name, value in namespace.items() if not name.startswith("__")}


SCENES = {"digits": digits, "fitted": fitted, "tracking": tracking, "optuna": optuna, "embeddings": embeddings,
          "digit-images": digit_images, "iris": iris, "named-columns": named_columns, "token-lm": token_lm,
          "preset-tokens": preset_tokens, "reviews": reviews, "notes": notes, "prompts": prompts,
          "vectors": vectors, "run": run, "": lambda spark, root: {}}


def test_every_scene_a_block_names_is_here():
    unknown = sorted({f"{block.where}: {block.scene}" for block in ON_SPARK if block.scene not in SCENES})
    assert unknown == [], f"scenes this file does not give: {unknown}"
    assert len(ON_SPARK) >= 25, len(ON_SPARK)


@pytest.fixture(scope="module", autouse=True)
def counted():
    """How many of the guides' blocks ran on Spark, printed at the end (test_docs.py counts the ones with none)."""
    yield
    print(f"\ndocs examples on local Spark: {len(set(RAN) & {block.where for block in ON_SPARK})} of "
          f"{len(ON_SPARK)} marked blocks ran ({len(PYTHON_BLOCKS)} Python blocks in the guides)")


@pytest.fixture
def tracking_here(tmp_path):
    """MLflow's tracking URI a SQLite store in the page's directory (its artifacts in ./mlruns there), then as it was."""
    import mlflow

    previous = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    yield
    mlflow.set_tracking_uri(previous)


@pytest.mark.parametrize("page", PAGES)
def test_a_pages_blocks_run_on_local_spark(page, spark, tmp_path, monkeypatch, tracking_here):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])  # python.md sets it: as it was after
    namespace = {"__name__": f"docs:{page}", "spark": spark, "tfbarrier": tfbarrier}  # as test_docs.py checks them
    for block in runnable(page):
        if block.on_spark:
            namespace.update(SCENES[block.scene](spark, str(tmp_path)))
        try:
            exec(compile(with_paths_in(block.code, tmp_path), block.where, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{block.where}: the block failed ({type(exc).__name__}: {exc})") from exc
        RAN.append(block.where)
