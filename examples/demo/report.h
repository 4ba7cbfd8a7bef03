/*
 * The demo's report: one self-contained SVG file (no scripts, fonts or links) with the training loss
 * against the entropy floor, and the final expert load of every layer as a sources x experts heat map.
 */
#ifndef DEMO_REPORT_H
#define DEMO_REPORT_H

#include <stdio.h>

typedef struct demo_report {
    const char *title;        /* one line: the run's configuration */
    const float *loss;        /* [steps] training loss of each step (nats) */
    const float *loss_smooth; /* [steps] smoothed ... */
    double smoothing;         /* ... by an EMA with this factor */
    int steps;
    double floor;             /* H(next | current) */
    double source_floor;      /* H(next | current, source) */
    double uniform;           /* ln V: the loss of a uniform guess */
    const int *expected_step; /* [num_expected] steps at which ... */
    const float *expected;    /* ... the exact expected loss was measured */
    int num_expected;
    const double *load;       /* [layers][sources][experts] routing of the trained model */
    int layers, sources, experts;
} demo_report;

/* Writes the SVG into f (opened for writing) and closes it. Returns 0, or -1 with errno set. */
int demo_report_write(const demo_report *r, FILE *f);

#endif
