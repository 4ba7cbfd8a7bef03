#include "base/decimal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

double moe_float_decimal(float f)
{
    if (!isfinite(f) || f == 0) return (double)f;
    /* printf and strtod are correctly rounded (glibc), and both follow the same LC_NUMERIC, so the
     * text never leaves this function in a form another locale would misread */
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*e", digits - 1, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f) return d;
    }
    return (double)f; /* not reached: 9 significant digits tell every float apart */
}
