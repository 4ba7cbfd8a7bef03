/*
 * The demo's terminal output. On a TTY the progress is one line redrawn with '\r'; otherwise (a pipe,
 * a log file, CI) it is a plain line every few percent. Tables and messages are printed above the
 * progress line. --quiet silences everything but what the caller prints itself.
 */
#ifndef DEMO_UI_H
#define DEMO_UI_H

#include <stdint.h>

typedef struct demo_ui {
    int tty;          /* stdout is a terminal */
    int quiet;
    int bar_shown;    /* a progress line is on screen and must be cleared before other output */
    int total_steps;
    int first_step;   /* steps done before this run started (a resumed run): the eta is this run's pace */
    int end_step;     /* where this run stops: total_steps, or earlier (--stop-after) */
    int line_every;   /* non-TTY: print a progress line every this many steps */
    double last_draw; /* TTY: time of the last redraw (seconds) */
} demo_ui;

typedef struct demo_progress {
    int step;                 /* steps done */
    double loss_smooth;       /* smoothed training loss (nats) */
    double floor;             /* entropy floor (nats) */
    double aux;               /* aux loss of the last step, summed over layers */
    double tokens_per_s;
    double elapsed_s;
    int64_t mem_current;      /* engine bytes in use */
    int64_t mem_peak;
} demo_progress;

/* A run of steps 1..total_steps; set first_step and end_step afterwards for a part of it. */
void demo_ui_init(demo_ui *ui, int quiet, int total_steps);
/* Redraws (TTY) or prints (otherwise, every line_every steps and at the end) the progress line. */
void demo_ui_progress(demo_ui *ui, const demo_progress *p, double now_s);
/* Ends the progress line before other output (no-op when none is shown). */
void demo_ui_break(demo_ui *ui);
/* The routing table: for each source, the share (%) of its routed assignments each expert received.
 * load is [S][E] assignment counts. */
void demo_ui_load_table(demo_ui *ui, const char *title, const double *load, int sources, int experts);
/* "1.5 MiB" style; buf of >= 16 bytes. */
const char *demo_format_bytes(int64_t bytes, char *buf, int cap);

#endif
