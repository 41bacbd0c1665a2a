"""Fits the polynomial of device_math.h's device_erfc (python fit_erfc.py prints it).

For a = |x| in [0, kMaxArg], erfc(a) = P(t) / (1 + 2a) * exp(-a^2) with
t = (a - 4) / (a + 4) in [-1, 0.43]: the quotient g = erfc(a) exp(a^2) (1 + 2a)
is smooth and between 1 and 1.23 there, so a polynomial of low degree holds
it to float32 precision. Least squares on 4000 Chebyshev-spaced points,
reweighted towards the largest relative errors (Lawson's iteration, which
approaches the minimax fit). Degree 9 gives 5.4e-8 relative (8: 7.4e-7).
"""

import math

import numpy as np

K = 4.0
MAX_ARG = 10.1  # device_erfc's kMaxArg: erfc(10.1) = 7e-46 is zero in float32
DEGREE = 9


def fit(degree=DEGREE, points=4000, rounds=60):
  t_hi = (MAX_ARG - K) / (MAX_ARG + K)
  t = -1.0 + (np.cos(np.linspace(0.0, np.pi, points)) + 1.0) / 2.0 * (t_hi + 1.0)
  a = K * (1.0 + t) / (1.0 - t)
  g = np.array([math.erfc(x) * math.exp(x * x) * (1.0 + 2.0 * x) for x in a])
  weight = np.ones_like(t)
  for _ in range(rounds):
    coef = np.polynomial.polynomial.polyfit(t, g, degree, w=np.sqrt(weight) / g)
    err = np.abs(np.polynomial.polynomial.polyval(t, coef) / g - 1.0)
    weight *= err / err.max() + 1e-3
    weight /= weight.mean()
  return coef.astype(np.float32), float(err.max())


if __name__ == "__main__":
  coef, err = fit()
  print(f"// max relative error of the fit: {err:.1e}")
  print(", ".join("%.9ef" % float(c) for c in coef))
