"""AttentiveProbe: the attention maths against torch, one-token data, determinism, inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.nets.attentive import AttentiveProbe, attentive_logits
from pipeline.protocols.linear.logistic import LogisticProbe

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")]

SMALL = dict(num_heads=4, batch_size=64, max_epochs=25, patience=5, device="cpu")


def _one_token(n, seed, T=32, d=16, K=4, position=2):
    """Every token carries a fixed positional code plus unit noise; only the token at
    ``position`` also carries its class centre. Mean pooling dilutes that signal T-fold."""
    codes = np.random.default_rng(123).standard_normal((T, d))
    centres = np.random.default_rng(7).standard_normal((K, d))
    rng = np.random.default_rng(seed)
    y = np.arange(n) % K
    X = codes + rng.standard_normal((n, T, d))
    X[:, position] += 1.5 * centres[y]
    return X.astype(np.float32), y


def test_attentive_logits_match_torch_multihead_attention():
    torch.manual_seed(0)
    d, H, K, B, T = 12, 3, 5, 4, 7
    mha = torch.nn.MultiheadAttention(d, H, batch_first=True, dtype=torch.float64)
    torch.nn.init.normal_(mha.in_proj_bias)  # the key bias too: it must not matter
    torch.nn.init.normal_(mha.out_proj.bias)
    norm = torch.nn.LayerNorm(d, dtype=torch.float64)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    head = torch.nn.Linear(d, K, dtype=torch.float64)
    query = torch.randn(d, dtype=torch.float64)
    X = torch.randn(B, T, d, dtype=torch.float64)
    with torch.no_grad():
        attended, _ = mha(query.expand(B, 1, d), X, X, need_weights=False)
        expected = head(norm(attended[:, 0]))
        Wq, Wk, Wv = mha.in_proj_weight.split(d)
        bq, _, bv = mha.in_proj_bias.split(d)
        p = {"query": query, "Wq": Wq.T, "Wk": Wk.T, "Wv": Wv.T, "bq": bq, "bv": bv,
             "Wo": mha.out_proj.weight.T, "bo": mha.out_proj.bias, "ln_w": norm.weight, "ln_b": norm.bias,
             "Wc": head.weight.T, "bc": head.bias}
        ours = attentive_logits({k: v.unsqueeze(0).contiguous() for k, v in p.items()}, X, H)[0]
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)


def test_beats_mean_pooled_linear_probe_when_the_class_lives_in_one_token():
    X, y = _one_token(800, 0)
    X_te, y_te = _one_token(400, 1)
    pooled = LogisticProbe(Cs="default").fit(X.mean(axis=1), y)
    linear = (pooled.predict(X_te.mean(axis=1)) == y_te).mean()
    attentive = (AttentiveProbe(**SMALL).fit(X, y).predict(X_te) == y_te).mean()
    assert attentive > 0.95
    assert attentive - linear > 0.3


def test_bitwise_repeatable_and_float16_tokens_are_exact():
    X, y = _one_token(200, 0, T=6, d=8)
    a = AttentiveProbe(**SMALL).fit(X, y)
    b = AttentiveProbe(**SMALL).fit(X, y)
    for name in a.params_:
        np.testing.assert_array_equal(a.params_[name], b.params_[name])
    # float16 tokens are cast to float32 batch by batch: same as float32 of the same values
    X16 = X.astype(np.float16)
    c = AttentiveProbe(**SMALL).fit(X16, y)
    d = AttentiveProbe(**SMALL).fit(X16.astype(np.float32), y)
    for name in c.params_:
        np.testing.assert_array_equal(c.params_[name], d.params_[name])
    np.testing.assert_array_equal(c.predict_proba(X16), d.predict_proba(X16.astype(np.float32)))


def test_selection_over_the_learning_rate_and_weight_decay_grid_is_recorded():
    X, y = _one_token(300, 0, T=8, d=8)
    probe = AttentiveProbe(**{**SMALL, "learning_rates": (1e-3, 1e-2), "weight_decays": (0.0, 0.1)}).fit(X, y)
    assert probe.grid_.tolist() == [[1e-3, 0.0], [1e-3, 0.1], [1e-2, 0.0], [1e-2, 0.1]]
    best = next(g for g, (lr, wd) in enumerate(probe.grid_)
                if lr == probe.learning_rate_ and wd == probe.weight_decay_)
    assert probe.val_accuracy_[best] == probe.val_accuracy_.max()
    assert probe.n_epochs_ == probe.best_epochs_[best]
    assert probe.val_curves_.shape[0] == 4
    assert probe.val_curves_[best, probe.n_epochs_ - 1] == probe.val_accuracy_[best]
    assert probe.solver_ == "adamw"


def test_fit_is_the_grid_then_the_refit_of_the_selected_point_and_batches_match_an_array():
    """The probe's fit is train_grid on the validation split, then train_fixed of the selected
    (lr, wd) on every row for its epochs; rows of two splits gathered per batch fit as their
    concatenation does."""
    X, y = _one_token(120, 0, T=6, d=8)
    val_mask = np.zeros(120, bool)
    val_mask[::4] = True
    settings = {**SMALL, "max_epochs": 6, "learning_rates": (1e-3, 1e-2), "weight_decays": (0.1,)}
    probe = AttentiveProbe(**settings).fit(X, y, val_mask=val_mask)
    from pipeline.protocols.nets.attentive import StackedAttentive
    from pipeline.protocols.nets.stacked_training import RowBatches, train_fixed, train_grid

    def make(G, generator):
        return StackedAttentive(G, 8, 4, SMALL["num_heads"], generator, torch.device("cpu"))

    Xt, yt = torch.from_numpy(X), torch.from_numpy(y.astype(np.int64))
    record = train_grid(make, Xt, yt, np.flatnonzero(~val_mask), np.flatnonzero(val_mask), np.array([1e-3, 1e-2]),
                        np.array([0.1, 0.1]), SMALL["batch_size"], 6, SMALL["patience"], 0, torch.device("cpu"))
    np.testing.assert_array_equal(record.val_accuracy, probe.val_curves_)
    refit = train_fixed(make, Xt, yt, np.arange(120), probe.learning_rate_, probe.weight_decay_,
                        SMALL["batch_size"], probe.n_epochs_, 0, torch.device("cpu"))
    for name, value in refit.params.items():
        np.testing.assert_array_equal(value.detach()[0].numpy(), probe.params_[name])
    order = np.r_[np.flatnonzero(~val_mask), np.flatnonzero(val_mask)]
    batched = AttentiveProbe(**settings).fit_batches(RowBatches([X[~val_mask], X[val_mask]]), y[order],
                                                     val_mask[order])
    whole = AttentiveProbe(**settings).fit(X[order], y[order], val_mask=val_mask[order])
    for name in whole.params_:
        np.testing.assert_array_equal(batched.params_[name], whole.params_[name])


def test_vit_token_features_feed_the_probe():
    """Input path only: a random-init timm ViT's forward_features gives (n, 1 + patches, d)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=0).eval()
    images = torch.randn(24, 3, 32, 32)
    with torch.no_grad():
        tokens = vit.forward_features(images).numpy()
    assert tokens.shape == (24, 1 + 4, vit.embed_dim)  # CLS first, then 2 x 2 patches
    y = np.arange(24) % 2
    probe = AttentiveProbe(**{**SMALL, "num_heads": 3, "max_epochs": 2}).fit(tokens.astype(np.float16), y)
    assert probe.n_features_in_ == vit.embed_dim and probe.n_tokens_in_ == 5
    assert probe.predict(tokens).shape == (24,)
    assert probe.predict_proba(tokens[:, 1:]).shape == (24, 2)  # any token count at prediction


def test_bad_inputs_are_refused():
    X, y = _one_token(40, 0, T=4, d=6)
    with pytest.raises(ConfigError, match="num_heads=4 does not divide the feature width d=6"):
        AttentiveProbe(**SMALL).fit(X, y)
    with pytest.raises(DataValidationError, match=r"shape \(40, 24\)"):
        AttentiveProbe(**{**SMALL, "num_heads": 2}).fit(X.reshape(40, -1), y)
    X_bad = X.copy()
    X_bad[3, 1, 2] = np.inf
    with pytest.raises(DataValidationError, match=r"\(3, 1, 2\)"):
        AttentiveProbe(**{**SMALL, "num_heads": 2}).fit(X_bad, y)
    with pytest.raises(ConfigError, match="learning_rates"):
        AttentiveProbe(**{**SMALL, "num_heads": 2, "learning_rates": (0.0,)}).fit(X, y)
    probe = AttentiveProbe(**{**SMALL, "num_heads": 2, "max_epochs": 1}).fit(X, y)
    with pytest.raises(DataValidationError, match="4 features per token, but AttentiveProbe is expecting 6"):
        probe.predict(X[:, :, :4])
