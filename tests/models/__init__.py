"""Models of a user's own, as ``--model tests.models.<module>:<function>`` imports them."""
