"""The bottom layer's helpers: pure code every other package may import, hardware/ and state/ included."""
