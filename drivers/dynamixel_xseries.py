"""The Dynamixel X-series (XM430 / XM540) control table: the addresses and values that the
driver (drivers/dynamixel.py) and the servo emulator (hil/dynamixel_emulator.py) use, and the
block the driver reads every cycle (ROBOTIS e-Manual; multi-byte values little-endian).
"""

from __future__ import annotations

ADDR_MODEL_NUMBER = 0
ADDR_OPERATING_MODE = 11
ADDR_CURRENT_LIMIT = 38
ADDR_TORQUE_ENABLE = 64
ADDR_HARDWARE_ERROR = 70
ADDR_BUS_WATCHDOG = 98  # 1 byte: 0 off / clear error, 1..127 x 20 ms, 0xFF (-1) watchdog error
BUS_WATCHDOG_ERROR = 0xFF
BUS_WATCHDOG_UNIT_MS = 20  # ms per unit of the Bus Watchdog
ADDR_GOAL_CURRENT = 102
ADDR_REALTIME_TICK = 120
ADDR_PRESENT_CURRENT = 126
ADDR_PRESENT_VELOCITY = 128
ADDR_PRESENT_POSITION = 132
MODE_CURRENT = 0
# the cyclic Sync Read block, addresses 120..135: Realtime Tick (2, ms, wraps at 32768), Moving,
# Moving Status, Present PWM (2), Present Current (2), Present Velocity (4), Present Position (4)
FEEDBACK_ADDR = ADDR_REALTIME_TICK
FEEDBACK_LEN = 16
FEEDBACK_FMT = "<HBBhhii"
STATUS_FEEDBACK_BYTES = 11 + FEEDBACK_LEN  # one status packet with the block, unstuffed
TICK_WRAP = 32768.0  # ms
TICK_MS = 1.0  # resolution of the Realtime Tick (ms): a stamp is up to this much before the instant
