"""Linear readouts: the L2 logistic probe (L-BFGS), the multi-label probe and its average precision, and the least-squares / ridge probe with exact leave-one-out selection."""
