"""The planted S3 credentials and bucket of the scale-out tests (the leak test searches for them)."""

PLANTED_KEY_ID = "AKIAPLANTEDKEYID7Q3X"
PLANTED_SECRET = "PLANTED-SECRET-9f3c2e71d4b8a6e05d1c"
BUCKET = "repeval-scaleout"
