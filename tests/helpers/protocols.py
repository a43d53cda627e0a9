"""Protocol settings shared by the property tests."""

# Cheap base settings per protocol, so a run on accepted settings stays fast.
CHEAP = {
    "fewshot": {"n_way": 2, "n_shot": 2, "n_query": 2, "n_episodes": 5},
    "lowshot": {"shots": [1, 2], "n_seeds": 1},
    "logistic": {"Cs": [0.1, 1.0], "max_iter": 50},
    "invariance": {"max_train": 24, "max_dims": 3},
    "mlp": {"hidden_units": 8, "learning_rate": 0.05, "max_epochs": 8, "patience": 3, "weight_decays": [0.0, 0.01],
            "linear_Cs": [1.0]},
    "attentive": {"num_heads": 1, "max_epochs": 8, "patience": 3, "learning_rates": [0.05], "weight_decays": [0.0]},
    "segmentation": {"learning_rates": [0.1, 1.0], "epochs": 4, "batch_size": 4, "device": "cpu"},
    "normals": {"head": "linear", "learning_rate": 0.5, "epochs": 4, "batch_size": 4, "device": "cpu"},
}


def as_tokens(data, n_tokens: int = 2):
    """``data`` with every feature row repeated as ``n_tokens`` tokens: (n, d) -> (n, T, d),
    for the protocols that read token features (the class is in every token)."""
    import dataclasses

    import numpy as np

    def tok(X):
        return None if X is None else np.repeat(np.asarray(X)[:, None], n_tokens, axis=1)

    return dataclasses.replace(data, X_train=tok(data.X_train), X_test=tok(data.X_test), X_val=tok(data.X_val))


def dense_data(task: str, n_train: int = 12, n_test: int = 6, grid: int = 4, size: int = 16, width: int = 8,
               informative: bool = True, seed: int = 0):
    """Tiny ``DenseData``: maps whose first channels carry each grid cell's label (a class,
    or a unit normal) plus noise (``informative=False``: noise only), and targets of
    ``size`` x ``size`` pixels, each grid cell's label over its block of pixels (the first
    pixel row ignored or invalid)."""
    import numpy as np

    from pipeline.protocols.dense.data import DenseData

    rng = np.random.default_rng(seed)
    block = size // grid
    axes = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0]], dtype=np.float64)

    def split(n):
        cells = rng.integers(0, 3 if task == "segmentation" else 4, (n, grid, grid))
        signal = np.eye(3)[np.minimum(cells, 2)] if task == "segmentation" else axes[cells]
        X = rng.normal(0, 0.4, (n, grid, grid, width))
        if informative:
            X[..., :3] += 2 * signal
        pixels = np.repeat(np.repeat(cells if task == "segmentation" else signal, block, axis=1), block, axis=2)
        if task == "segmentation":
            y = pixels.astype(np.uint8)
            y[:, 0] = 255
        else:
            y = pixels.astype(np.float16)
            y[:, 0] = 0
        return X.astype(np.float16), y

    X_train, y_train = split(n_train)
    X_test, y_test = split(n_test)
    return DenseData(task, X_train, y_train, X_test, y_test, 3)
def seed_choice(scores, iters) -> int:
    """The C grid position the logistic tie rule keeps: walking C upwards, a better validation
    score, or an equal one whose fit moved (0 iterations: the previous value's model),
    replaces the choice (Ericsson et al.: the weakest penalty among the best)."""
    best = 0
    for j in range(1, len(scores)):
        if scores[j] > scores[best] or (scores[j] == scores[best] and iters[j] > 0):
            best = j
    return best
