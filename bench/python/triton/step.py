"""The cost of one step of a batch of `n` requests: 2 ms, plus 0.1 ms a request (a GPU's step
grows little with its batch). It sleeps, so that the server and the load generator have the
machine's cores to themselves."""

import time


def step(n):
    time.sleep(0.002 + 0.0001 * n)
