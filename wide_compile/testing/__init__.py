"""User-facing correctness checks for a transformed model."""
