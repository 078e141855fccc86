"""Channel workers: consume, claim, check, throttle, render, send, record."""
