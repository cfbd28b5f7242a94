"""What a deploy does to one host, stage by stage (``sglang_fleet.converge`` runs them in order)."""
