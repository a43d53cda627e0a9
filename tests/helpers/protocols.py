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
}


def as_tokens(data, n_tokens: int = 2):
    """``data`` with every feature row repeated as ``n_tokens`` tokens: (n, d) -> (n, T, d),
    for the protocols that read token features (the class is in every token)."""
    import dataclasses

    import numpy as np

    def tok(X):
        return None if X is None else np.repeat(np.asarray(X)[:, None], n_tokens, axis=1)

    return dataclasses.replace(data, X_train=tok(data.X_train), X_test=tok(data.X_test), X_val=tok(data.X_val))


def seed_choice(scores, iters) -> int:
    """The C grid position the logistic tie rule keeps: walking C upwards, a better validation
    score, or an equal one whose fit moved (0 iterations: the previous value's model),
    replaces the choice (Ericsson et al.: the weakest penalty among the best)."""
    best = 0
    for j in range(1, len(scores)):
        if scores[j] > scores[best] or (scores[j] == scores[best] and iters[j] > 0):
            best = j
    return best
