"""Flow control: groups, concurrency keys, rate limits and priority."""
