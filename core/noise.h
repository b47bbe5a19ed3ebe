/*
 * noise.h - noise samplers and calibrations for the privacy mechanisms (Wu et al. 2017,
 * "Bolt-on DP", eqs. (3) and (4); Appendix E's sampler with the direction uniform on the unit
 * sphere: the paper says "in the unit ball", which shrinks the norm by a Beta(d, 1) factor).
 */
#ifndef DPSQL_NOISE_H
#define DPSQL_NOISE_H

#include <stddef.h>

#include "csprng.h"

/* Standard normal (Marsaglia polar method). */
double		dpsql_sample_normal(DpsqlRng *rng);

/*
 * Standard normal by the ziggurat method (Marsaglia-Tsang 2000, as ZIGNOR in Doornik 2005):
 * about one 64-bit draw per normal, for the noise added to every step of private SGD.
 */
double		dpsql_sample_normal_fast(DpsqlRng *rng);

/* n such normals: exactly the draws of n dpsql_sample_normal_fast calls, in order. */
void		dpsql_fill_normal_fast(DpsqlRng *rng, double *out, size_t n);

/* Gamma(shape, scale) (Marsaglia-Tsang; shape < 1 by the boost U^(1/shape)). */
double		dpsql_sample_gamma(DpsqlRng *rng, double shape, double scale);

/* A uniform direction on the unit sphere S^{d-1} (a normalised Gaussian vector). */
void		dpsql_sample_direction(DpsqlRng *rng, double *out, int d);

/*
 * Eq. (3): density proportional to exp(-epsilon ||k|| / sensitivity) on R^d, i.e. a radius
 * ~ Gamma(d, sensitivity/epsilon) times a uniform direction ON the sphere (ERRATA: not in the
 * ball). Adds the noise to v.
 */
void		dpsql_add_l2_laplace(DpsqlRng *rng, double *v, int d, double sensitivity, double epsilon);

/* Adds i.i.d. N(0, sigma^2) to each of the d coordinates of v. */
void		dpsql_add_gaussian(DpsqlRng *rng, double *v, int d, double sigma);

/*
 * delta(epsilon) of the Gaussian mechanism with noise sigma and L2 sensitivity (Balle and
 * Wang 2018, Theorem 8; exact):
 *   Phi(s/(2 sigma) - epsilon sigma/s) - e^epsilon Phi(-s/(2 sigma) - epsilon sigma/s).
 */
double		dpsql_gaussian_delta(double sigma, double sensitivity, double epsilon);

/* Smallest sigma with dpsql_gaussian_delta(sigma) <= delta (the analytic Gaussian mechanism). */
double		dpsql_gaussian_sigma_analytic(double sensitivity, double epsilon, double delta);

/*
 * The classic Gaussian mechanism (eq. (4); Dwork-Roth Thm A.1), the one place its formula
 * 2 ln(1.25/delta) lives: sensitivity * sqrt(2 ln(1.25/delta)) / epsilon; valid for
 * epsilon < 1 only (NaN else, and unless 0 < delta < 1).
 */
double		dpsql_gaussian_sigma_classic(double sensitivity, double epsilon, double delta);

/*
 * The same formula on epsilon in (0, 1], the bound included: BST14 (Algorithms 4 and 5)
 * applies it at its amplified epsilon_2 = min(1, .), as its paper does. NaN outside.
 */
double		dpsql_gaussian_sigma_classic_closed(double sensitivity, double epsilon, double delta);

/*
 * E||b||^2 / sensitivity^2 of a dim-dimensional noise draw when each of `shares` releases
 * (one-vs-rest models) gets (epsilon, delta) / shares: with delta = 0 the Gamma-norm noise of
 * eq. (3), norm ~ Gamma(dim, shares / epsilon), dim (dim + 1) (shares / epsilon)^2; with
 * delta > 0, dim times the classic Gaussian's variance at the share,
 * 2 dim ln(1.25 shares / delta) (shares / epsilon)^2, as an estimate at any epsilon (output
 * perturbation's default regulariser: 49_output_perturbation.sql). Written in the order that
 * regulariser has always used (a seeded release stays bit-identical). NaN unless dim >= 1,
 * shares >= 1, epsilon > 0 finite and 0 <= delta < 1.
 */
double		dpsql_noise_sq_norm(int dim, double epsilon, double delta, int shares);

#endif
