"""What is physically on the node: typed, frozen facts and the backends that read them."""
