/*
 * The one reading of float config fields (abi/moe.h, "Float fields"; docs/math.md §1): a float carries
 * the decimal the host wrote, so the engine reads it as that decimal, in double.
 */
#ifndef MOE_BASE_DECIMAL_H
#define MOE_BASE_DECIMAL_H

/* The double nearest to the shortest decimal (fewest significant digits, at most 9) that rounds back
 * to f: 0.1f -> 0.1, 1.1f -> 1.1, 1.1000001f -> 1.1000001. (float)moe_float_decimal(f) == f for every
 * float, so no information is lost. 0, infinities and NaN are returned as they are. */
double moe_float_decimal(float f);

#endif
