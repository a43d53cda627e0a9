"""Nearest-neighbour readouts: weighted and plain k-NN over streamed train blocks."""
