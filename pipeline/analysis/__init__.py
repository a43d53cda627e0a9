"""Analyses across encoders and runs: logit-space correlation, rank agreement, paired comparison, checkpoint series, the leaderboard and the ImageNet-CoG levels."""
