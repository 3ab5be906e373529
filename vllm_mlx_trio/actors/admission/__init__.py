"""The admission actor: requests checked, templated, tokenized and media loaded before the scheduler sees them."""
