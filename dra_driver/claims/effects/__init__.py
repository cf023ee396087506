"""The side effects of preparing a claim, one module each, behind one contract (`contract.py`).

Each side effect says what it records before it acts (its entry), how it acts, how it undoes what
an entry names, and what start-up may find of it that no record owns. `registry.py` lists them in
the order prepare makes them; unprepare and the rollback undo them in the reverse order.
"""
