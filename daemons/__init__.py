"""mrcd: the endpoint daemon (issue 4)."""
