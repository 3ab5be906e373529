"""``bench soak``: thousands of mixed requests, then a leak check."""
