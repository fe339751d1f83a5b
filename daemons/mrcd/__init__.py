"""mrcd: the endpoint daemon and node controller."""
