/*
 * composition.h - closed-form conversions between privacy notions, the one place for them:
 * zero-concentrated DP and (epsilon, delta) (Bun-Steinke 2016), the Gaussian noise of a
 * rho-zCDP release, and the per-step epsilon of advanced composition (Dwork-Rothblum-Vadhan;
 * BST14's line 5 as Wu et al. 2017, Appendix F, Algorithm 4 means it: the paper prints
 * (e_1^eps - 1) for (e^{epsilon_1} - 1)).
 * Accountants for sampled mechanisms are dp-accounting's (dpsql/accounting.py), never here.
 */
#ifndef DPSQL_COMPOSITION_H
#define DPSQL_COMPOSITION_H

/*
 * The largest rho whose conversion rho + 2 sqrt(rho ln(1/delta)) is at most epsilon:
 * (sqrt(ln(1/delta) + epsilon) - sqrt(ln(1/delta)))^2. NaN unless epsilon > 0 is finite and
 * 0 < delta < 1.
 */
double		dpsql_zcdp_rho(double epsilon, double delta);

/* epsilon of rho-zCDP at delta: rho + 2 sqrt(rho ln(1/delta)). */
double		dpsql_zcdp_epsilon(double rho, double delta);

/*
 * The standard deviation of the Gaussian mechanism of L2 sensitivity `sensitivity` that is
 * (rho / shares)-zCDP, Delta^2 / (2 sigma^2) = rho / shares (Bun-Steinke 2016, Prop. 1.6):
 * sensitivity / sqrt(2 rho / shares), one of `shares` equal releases that compose to rho.
 * Written in that order: the linear mechanisms' plans have always divided 2 rho by the
 * shares (AdaSSP: 2 rho / 3), and a seeded release stays bit-identical. NaN unless
 * sensitivity >= 0 and rho > 0 are finite and shares >= 1 is finite.
 */
double		dpsql_zcdp_sigma(double sensitivity, double rho, double shares);

/*
 * The per-step epsilon_1 of `steps` adaptive epsilon_1-DP steps that advanced composition
 * makes (epsilon, steps delta_1 + delta_1)-DP: the root of
 *   epsilon = steps e1 (e^{e1} - 1) + sqrt(2 steps ln(1/delta1)) e1
 * (increasing in e1), by bisection on [0, min(epsilon, 50)]. NaN on bad input.
 */
double		dpsql_advanced_composition_step(double epsilon, double delta1, double steps);

#endif
