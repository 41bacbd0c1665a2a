"""Fits the polynomials of activation_device_math.h's device_normal_cdf (python fit_erfc.py prints them).

For a = |x| in [0, kMaxArg], erfc(a) = u P(u) exp(-a^2) with u = 1 / (1 + K a)
in [0.165, 1]: the quotient g = erfc(a) exp(a^2) / u is smooth there (it
tends to K / sqrt(pi) as a grows), so a polynomial of low degree holds it.
Least squares on 4000 Chebyshev-spaced points, reweighted towards the largest
relative errors (Lawson's iteration, which approaches the minimax fit).
Degree 8 gives 4.3e-8 relative (for float32 outputs), degree 6 1.4e-6 (for
16-bit outputs, whose exp(-a^2) is off by up to 6e-6 anyway). Printed halved:
the device evaluates Phi(-|h|) = erfc(|h| / sqrt 2) / 2 = u P(u) / 2 exp(-h^2 / 2).
"""

import math

import numpy as np

K = 0.5
MAX_ARG = 10.1  # device_normal_cdf's kMaxArg / sqrt 2: erfc(10.1) = 7e-46 is zero in float32
DEGREES = (8, 6)


def fit(degree, points=4000, rounds=300):
  u_lo = 1.0 / (1.0 + K * MAX_ARG)
  u = u_lo + (np.cos(np.linspace(0.0, np.pi, points)) + 1.0) / 2.0 * (1.0 - u_lo)
  a = (1.0 / u - 1.0) / K
  g = np.array([math.erfc(x) * math.exp(x * x) / w for x, w in zip(a, u)])
  weight = np.ones_like(u)
  for _ in range(rounds):
    coef = np.polynomial.polynomial.polyfit(u, g, degree, w=np.sqrt(weight) / g)
    err = np.abs(np.polynomial.polynomial.polyval(u, coef) / g - 1.0)
    weight *= err / err.max() + 1e-3
    weight /= weight.mean()
  return coef.astype(np.float32), float(err.max())


if __name__ == "__main__":
  for degree in DEGREES:
    coef, err = fit(degree)
    print(f"// degree {degree}, highest first; max relative error of the fit: {err:.1e}")
    print(", ".join("%.9ef" % (float(c) / 2) for c in coef[::-1]))
