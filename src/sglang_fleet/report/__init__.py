"""What the product tells the operator: fleet status, the end of a run, Prometheus targets."""
