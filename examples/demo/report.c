/* The demo's SVG report: see report.h. */
#include "report.h"

#include <math.h>
#include <stdio.h>

#define WIDTH 960.0
#define CHART_X 70.0  /* plot area of the loss chart */
#define CHART_Y 80.0
#define CHART_W 840.0
#define CHART_H 300.0

/* A round tick spacing (1, 2 or 5 times a power of ten) giving about `ticks` intervals over span. */
static double nice_step(double span, int ticks)
{
    double raw = span / ticks, mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * mag;
}

static double px(const demo_report *r, double step)
{
    return CHART_X + CHART_W * step / r->steps; /* step = optimiser updates done, 0 .. steps */
}

static double py(double loss, double ymax)
{
    double v = loss < 0.0 ? 0.0 : loss > ymax ? ymax : loss;
    return CHART_Y + CHART_H * (1.0 - v / ymax);
}

static void polyline(FILE *f, const demo_report *r, const float *y, double ymax, const char *style)
{
    int stride = r->steps / 4000 + 1; /* keeps the file small for long runs */
    fprintf(f, "<polyline fill=\"none\" %s points=\"", style);
    for (int i = 0; i < r->steps; i += stride)
        fprintf(f, "%.1f,%.1f ", px(r, i), py(y[i], ymax));
    fprintf(f, "\"/>\n");
}

/* Line styles of the chart, shared by the lines and the legend. */
#define STYLE_RAW "stroke=\"#b9c8de\" stroke-width=\"1\""
#define STYLE_SMOOTH "stroke=\"#1f5fbf\" stroke-width=\"2\""
#define STYLE_EXPECTED "stroke=\"#2ca02c\" stroke-width=\"2\""
#define STYLE_FLOOR "stroke=\"#d62728\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\""
#define STYLE_REFERENCE "stroke=\"#999\" stroke-dasharray=\"2 3\""

static void hline(FILE *f, double y, const char *style)
{
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" %s/>\n", CHART_X, y, CHART_X + CHART_W, y, style);
}

/* One legend row: a line sample and its text. */
static void legend_row(FILE *f, double x, double y, const char *style, const char *text)
{
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" %s/>\n", x, y - 4, x + 24, y - 4, style);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"small\">%s</text>\n", x + 30, y, text);
}

static void loss_chart(FILE *f, const demo_report *r)
{
    double ymax = r->uniform;
    for (int i = 0; i < r->steps; i++)
        ymax = r->loss[i] > ymax ? r->loss[i] : ymax;
    ymax = ymax > 2.0 * r->uniform ? 2.0 * r->uniform : ymax; /* an early spike must not flatten the curve */
    double ystep = nice_step(ymax, 6);
    ymax = ceil(ymax / ystep) * ystep;

    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fbfbfd\" stroke=\"#888\"/>\n",
            CHART_X, CHART_Y, CHART_W, CHART_H);
    for (double v = 0.0; v <= ymax + 1e-9; v += ystep) {
        double y = py(v, ymax);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4ea\"/>\n", CHART_X, y,
                CHART_X + CHART_W, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" class=\"small\">%g</text>\n", CHART_X - 6, y + 4, v);
    }
    double xstep = nice_step(r->steps, 8);
    for (double s = 0.0; s <= r->steps + 1e-9; s += xstep) {
        double x = px(r, s);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4ea\"/>\n", x, CHART_Y, x,
                CHART_Y + CHART_H);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"small\">%g</text>\n", x,
                CHART_Y + CHART_H + 16, s);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">training step</text>\n", CHART_X + CHART_W / 2,
            CHART_Y + CHART_H + 34);
    fprintf(f, "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">"
               "cross-entropy (nats / token)</text>\n",
            CHART_Y + CHART_H / 2, CHART_Y + CHART_H / 2);

    hline(f, py(r->uniform, ymax), STYLE_REFERENCE);
    hline(f, py(r->source_floor, ymax), STYLE_REFERENCE);
    polyline(f, r, r->loss, ymax, STYLE_RAW);
    polyline(f, r, r->loss_smooth, ymax, STYLE_SMOOTH);
    fprintf(f, "<polyline fill=\"none\" %s points=\"", STYLE_EXPECTED);
    for (int i = 0; i < r->num_expected; i++)
        fprintf(f, "%.1f,%.1f ", px(r, r->expected_step[i]), py(r->expected[i], ymax));
    fprintf(f, "\"/>\n");
    hline(f, py(r->floor, ymax), STYLE_FLOOR);

    /* the legend, right of the early steps' steep fall and above the floor */
    const double lx = CHART_X + CHART_W - 370, ly = CHART_Y + 0.22 * CHART_H;
    char text[128];
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"362\" height=\"94\" fill=\"white\" stroke=\"#ccc\"/>\n", lx - 8,
            ly - 14);
    legend_row(f, lx, ly, STYLE_RAW, "training loss of each step");
    snprintf(text, sizeof text, "smoothed (moving average, factor %g)", r->smoothing);
    legend_row(f, lx, ly + 15, STYLE_SMOOTH, text);
    legend_row(f, lx, ly + 30, STYLE_EXPECTED, "expected loss (exact, over the data distribution)");
    snprintf(text, sizeof text, "entropy floor H(next | current) = %.4f", r->floor);
    legend_row(f, lx, ly + 45, STYLE_FLOOR, text);
    snprintf(text, sizeof text, "with the source known: H(next | current, source) = %.4f", r->source_floor);
    legend_row(f, lx, ly + 60, STYLE_REFERENCE, text);
    snprintf(text, sizeof text, "uniform guess: ln V = %.4f", r->uniform);
    legend_row(f, lx, ly + 75, STYLE_REFERENCE, text);
}

/* white -> blue by share in [0, 1] */
static void cell_colour(double share, int *red, int *green, int *blue)
{
    *red = (int)(255 - share * (255 - 31));
    *green = (int)(255 - share * (255 - 95));
    *blue = (int)(255 - share * (255 - 191));
}

/* Where the heat maps go: one per layer, as many side by side as fit. */
typedef struct heat_layout {
    double label_w, gap, cell, map_w, map_h;
    int per_row;
} heat_layout;

static heat_layout layout_heat_maps(const demo_report *r)
{
    const double avail = WIDTH - 2 * 40.0, min_cell = 14.0, max_cell = 44.0;
    heat_layout h;
    h.label_w = 70.0;
    h.gap = 40.0;
    /* as many maps side by side as fit with the smallest cells (at most 3), then cells as large as fit */
    h.per_row = (int)((avail + h.gap) / (h.label_w + min_cell * r->experts + h.gap));
    h.per_row = h.per_row > 3 ? 3 : h.per_row;
    h.per_row = h.per_row > r->layers ? r->layers : h.per_row;
    h.per_row = h.per_row < 1 ? 1 : h.per_row;
    h.cell = ((avail + h.gap) / h.per_row - h.gap - h.label_w) / r->experts;
    h.cell = h.cell > max_cell ? max_cell : h.cell < min_cell ? min_cell : h.cell;
    h.map_w = h.label_w + h.cell * r->experts;
    h.map_h = 36.0 + h.cell * r->sources;
    return h;
}

/* Height of the heat-map section, its title included. */
static double heat_maps_height(const demo_report *r)
{
    heat_layout h = layout_heat_maps(r);
    return 22.0 + (r->layers + h.per_row - 1) / h.per_row * (h.map_h + 20.0);
}

static void heat_maps(FILE *f, const demo_report *r, double top)
{
    const heat_layout h = layout_heat_maps(r);
    const double label_w = h.label_w, cell = h.cell, map_w = h.map_w, map_h = h.map_h, gap = h.gap;
    const int per_row = h.per_row;
    fprintf(f, "<text x=\"40\" y=\"%.1f\" class=\"head\">Expert load of the trained model: share of each "
               "source's tokens per expert</text>\n", top);
    top += 22.0;
    for (int l = 0; l < r->layers; l++) {
        double x0 = 40.0 + (l % per_row) * (map_w + gap), y0 = top + (l / per_row) * (map_h + 20.0);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">layer %d</text>\n", x0, y0 + 12, l);
        for (int e = 0; e < r->experts; e++)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"small\">e%d</text>\n",
                    x0 + label_w + (e + 0.5) * cell, y0 + 30, e);
        for (int s = 0; s < r->sources; s++) {
            const double *row = r->load + ((size_t)l * r->sources + s) * r->experts;
            double total = 0.0, y = y0 + 36.0 + s * cell;
            for (int e = 0; e < r->experts; e++)
                total += row[e];
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"small\">source %d</text>\n", x0, y + cell / 2 + 4, s);
            for (int e = 0; e < r->experts; e++) {
                double share = total > 0.0 ? row[e] / total : 0.0;
                int cr, cg, cb;
                cell_colour(share * 2.0 > 1.0 ? 1.0 : share * 2.0, &cr, &cg, &cb); /* full colour at 50% */
                double x = x0 + label_w + e * cell;
                fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"rgb(%d,%d,%d)\" "
                           "stroke=\"white\"/>\n", x, y, cell, cell, cr, cg, cb);
                if (cell >= 26.0)
                    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"small%s\">%.0f</text>\n",
                            x + cell / 2, y + cell / 2 + 4, share > 0.3 ? " light" : "", 100.0 * share);
            }
        }
    }
}

int demo_report_write(const demo_report *r, FILE *f)
{
    const double heat_top = CHART_Y + CHART_H + 70.0, bottom = heat_top + heat_maps_height(r);

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\" font-size=\"13\">\n", WIDTH, bottom + 40, WIDTH, bottom + 40);
    fprintf(f, "<style>.small{font-size:11px;fill:#333}.light{fill:white}.head{font-size:14px;font-weight:bold}</style>\n");
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"40\" y=\"28\" font-size=\"17\" font-weight=\"bold\">libmoe train_demo: a small MoE language "
               "model on a mixture of Markov sources</text>\n");
    fprintf(f, "<text x=\"40\" y=\"48\" class=\"small\">%s</text>\n", r->title);
    if (r->num_expected > 0) {
        double last = r->expected[r->num_expected - 1];
        fprintf(f, "<text x=\"40\" y=\"64\" class=\"small\">expected loss at the end %.4f nats/token, %.4f above the "
                   "entropy floor %.4f</text>\n", last, last - r->floor, r->floor);
    }
    loss_chart(f, r);
    heat_maps(f, r, heat_top);
    fprintf(f, "</svg>\n");
    int failed = ferror(f);
    return fclose(f) == 0 && !failed ? 0 : -1;
}
