"""The served machine's runtime parts: its state machine and motion sources (jog, moves and programs
with time scaling, live targets)."""
