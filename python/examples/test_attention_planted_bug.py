"""The PyTorch paged decode with its planted bug (the query's own key never
attended): kvsim.testing.attention_report fails it, naming the sequences and
heads. This file is expected to fail (python/tests/test_examples.py checks how)."""

from test_attention_reference import check_decode


def test_decode_drops_the_last_key():
    check_decode(bug="drops_last_key")
