"""The generation loop and the speculative round."""
