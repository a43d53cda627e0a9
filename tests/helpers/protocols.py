"""Protocol settings shared by the property tests."""

# Cheap base settings per protocol, so a run on accepted settings stays fast.
CHEAP = {
    "fewshot": {"n_way": 2, "n_shot": 2, "n_query": 2, "n_episodes": 5},
    "lowshot": {"shots": [1, 2], "n_seeds": 1},
    "logistic": {"Cs": [0.1, 1.0], "max_iter": 50},
    "invariance": {"max_train": 24, "max_dims": 3},
}
