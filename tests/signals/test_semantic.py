"""The semantic accuracy signal on the real all-MiniLM-L6-v2 weights (the `semantic` extra, which
`dev` installs): equal to sentence-transformers' recipe, deterministic, batch-size invariant."""

import pytest
import torch

import psyrl.signals.semantic as semantic
from psyrl.core.config import load_config
from psyrl.rl.accuracy import Pair
from psyrl.signals.build import build_signal
from psyrl.signals.semantic import SemanticError, SemanticSignal, default_encoder

TEXTS = [
    "Proud",
    "She beams with pride at his achievement.",
    "Very angry.",
    "Very calm.",
    "Anne thinks the chocolate is in the blue box, where she left it before going out.",
]
PAIRS = [
    Pair("Proud", "She beams with pride at his achievement."),
    Pair("Very angry.", "Very calm."),
    Pair("Very angry.", "Furious."),
    Pair("Tom is very sad.", "He is heartbroken."),
    Pair(
        "Anne thinks the chocolate is in the blue box.",
        "She expects the sweets where she left them.",
    ),
    Pair("Tom is very sad.", "Tom is very happy."),
]
# the batch-size tolerance: a text's embedding moves by ~3e-7 with the other texts of its batch
# (padding changes the matrix shapes); measured under ATEN_CPU_CAPABILITY=default, avx2 and avx512
BATCH_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def signal():
    return SemanticSignal()


def test_default_encoder_is_the_installed_minilm():
    directory = default_encoder()
    assert (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()


def test_missing_extra_names_the_install(monkeypatch):
    monkeypatch.setattr(semantic.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SemanticError, match=r"pip install 'psyrl\[semantic\]'"):
        default_encoder()


def test_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(SemanticError, match=f"{tmp_path}: not a Hugging Face encoder directory"):
        SemanticSignal(encoder=tmp_path)


def test_an_encoder_that_does_not_mean_pool_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    with pytest.raises(SemanticError, match="pools by pooling_mode_cls_token"):
        SemanticSignal(encoder=tmp_path)


@pytest.mark.numerics
def test_equals_sentence_transformers_encode(signal):
    """The five lines of mean pooling + normalisation are sentence-transformers' Pooling and
    Normalize modules (the model's modules.json): the reference-equivalence test."""
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(default_encoder()), device="cpu")
    expected = reference.encode(TEXTS, convert_to_tensor=True, normalize_embeddings=True)
    torch.testing.assert_close(signal.encode(TEXTS), expected, atol=1e-6, rtol=0)


def test_scores_are_float64_in_unit_interval(signal):
    scores = signal(PAIRS)
    assert scores.dtype == torch.float64 and scores.shape == (len(PAIRS),)
    assert ((scores >= 0) & (scores <= 1)).all()
    assert signal.name == "semantic"
    # token F1 scores "Proud" against the paraphrase 0 (no shared word); the encoder does not
    assert scores[0] > 0.2


def test_identical_texts_score_one(signal):
    scores = signal([Pair(t, t) for t in TEXTS])
    torch.testing.assert_close(
        scores, torch.ones(len(TEXTS), dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_empty_answer_scores_zero(signal):
    scores = signal([Pair("Proud", ""), Pair("Proud", "   "), Pair("Proud", "Proud")])
    assert scores[0] == 0 and scores[1] == 0 and scores[2] > 0.99


def test_deterministic_whatever_the_gold_cache_holds(signal):
    """Two calls give the same floats, and so does a fresh instance whose cache is empty (a resumed
    run): golds are encoded one by one, so a gold's embedding is its text's alone."""
    first = signal(PAIRS)
    assert torch.equal(first, signal(PAIRS))
    fresh = SemanticSignal()
    fresh([Pair("Something else entirely.", "x"), *reversed(PAIRS)])  # other golds cached first
    assert torch.equal(fresh(PAIRS), first)


@pytest.mark.numerics
def test_batch_size_invariant_within_tolerance(signal):
    one = SemanticSignal(batch_size=1)
    three = SemanticSignal(batch_size=3)
    reference = signal(PAIRS)
    torch.testing.assert_close(one(PAIRS), reference, atol=BATCH_TOLERANCE, rtol=0)
    torch.testing.assert_close(three(PAIRS), reference, atol=BATCH_TOLERANCE, rtol=0)


def test_build_signal_makes_it_from_the_config():
    cfg = load_config(None, ["semantic.batch_size=2"])
    built = build_signal("semantic", cfg)
    assert isinstance(built, SemanticSignal) and built.batch_size == 2
    assert built.directory == default_encoder()
