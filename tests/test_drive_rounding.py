"""round_carried (drivers/base.py): integer drive commands whose average is the command."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.drivers.base import round_carried


@pytest.mark.parametrize("x", [0.3, -0.3, 13.3, -26.9, 0.5, 2.5, 1193.0])
def test_the_average_of_the_sent_values_is_the_command(x):
    carry = [0.0]
    sent = [round_carried(x, carry, 0, 1193) for _ in range(100)]
    assert abs(sum(sent) - 100 * x) <= 0.5
    assert set(sent) <= {int(np.floor(x)), int(np.ceil(x))}
    assert abs(carry[0]) <= 0.5


def test_a_clamped_command_carries_nothing():
    carry = [0.4]
    assert round_carried(5000.0, carry, 0, 1193) == 1193 and carry == [0.0]
    assert round_carried(-5000.0, carry, 0, 1193) == -1193 and carry == [0.0]
    assert round_carried(0.3, carry, 0, 1193) == 0 and carry[0] == pytest.approx(0.3)


def test_axes_carry_their_own_remainder():
    carry = [0.0, 0.0]
    a = [round_carried(0.25, carry, 0, 100) for _ in range(4)]
    b = [round_carried(-0.75, carry, 1, 100) for _ in range(4)]
    assert sum(a) == 1 and sum(b) == -3
