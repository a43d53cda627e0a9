"""Small trained probes on frozen features: the MLP and the attentive probe, trained a whole grid at once."""
