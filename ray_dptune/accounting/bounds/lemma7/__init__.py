"""Papernot & Steinke's Lemma 7 for any law of K, evaluated at its certified numerical worst case."""
