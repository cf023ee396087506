"""How a GPU is shared among claims: the sharing plan (time-slicing, MPS), the MPS control
daemons and their pods. Imported only by the protocol (side_effects, prepared) and the agent's
wiring; it imports the claim reading of claims/ and edits/."""
