"""Drafter training: data, rows, features, masks, losses, vocab, trainer, regeneration."""
