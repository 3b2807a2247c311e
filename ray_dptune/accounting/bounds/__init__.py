"""The bounds of whole searches: random-count selection, sparse-vector rounds, DP-BO, tuning on a sample."""
