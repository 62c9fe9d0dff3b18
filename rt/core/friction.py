"""The friction model shared by the controller's feedforward, the simulated plant and the
replay's friction fit: viscous b v + Coulomb Fc tanh(v / V_EPS), per actuator."""

V_EPS = 1e-3  # m/s or rad/s: Coulomb friction smoothing (the tanh's velocity scale)
