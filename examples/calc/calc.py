"""A tiny calculator with a bug for the Cairn demo to fix."""


def add(a, b):
    return a - b


def mul(a, b):
    return a * b
