/* Terminal output for the demo: see ui.h. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "ui.h"

#include "model.h"

#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

void demo_ui_init(demo_ui *ui, int quiet, int total_steps)
{
    memset(ui, 0, sizeof *ui);
    ui->tty = isatty(STDOUT_FILENO);
    ui->quiet = quiet;
    ui->total_steps = total_steps;
    ui->end_step = total_steps;
    ui->line_every = total_steps >= 20 ? total_steps / 20 : 1;
    ui->last_draw = -1.0;
}

const char *demo_format_bytes(int64_t bytes, char *buf, int cap)
{
    if (bytes >= (int64_t)1 << 30)
        snprintf(buf, (size_t)cap, "%.2f GiB", (double)bytes / (1 << 30));
    else if (bytes >= (int64_t)1 << 20)
        snprintf(buf, (size_t)cap, "%.1f MiB", (double)bytes / (1 << 20));
    else
        snprintf(buf, (size_t)cap, "%.1f KiB", (double)bytes / 1024.0);
    return buf;
}

static int terminal_width(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 100;
}

static void format_seconds(double s, char *buf, size_t cap)
{
    if (s < 60.0)
        snprintf(buf, cap, "%.0fs", s);
    else
        snprintf(buf, cap, "%dm%02ds", (int)(s / 60.0), (int)s % 60);
}

/* The part of the progress line after the bar, most important first (a narrow terminal cuts the end). */
static void progress_text(const demo_ui *ui, const demo_progress *p, char *buf, size_t cap)
{
    char cur[24], peak[24], when[16];
    const int done = p->step >= ui->end_step, ran = p->step - ui->first_step;
    format_seconds(done || ran <= 0 ? p->elapsed_s : p->elapsed_s * (ui->end_step - p->step) / ran, when, sizeof when);
    demo_format_bytes(p->mem_current, cur, sizeof cur);
    demo_format_bytes(p->mem_peak, peak, sizeof peak);
    snprintf(buf, cap, "%*d/%d  loss %.3f (floor %.3f, %+.3f)  %.1fk tok/s  %s %s  mem %s (peak %s)  aux %.4f",
             (int)snprintf(NULL, 0, "%d", ui->total_steps), p->step, ui->total_steps, p->loss_smooth, p->floor,
             p->loss_smooth - p->floor, p->tokens_per_s / 1000.0, done ? "took" : "eta", when, cur, peak, p->aux);
}

void demo_ui_progress(demo_ui *ui, const demo_progress *p, double now_s)
{
    if (ui->quiet)
        return;
    char text[256];
    progress_text(ui, p, text, sizeof text);
    const int done = p->step >= ui->end_step;
    if (!ui->tty) {
        if (done || p->step % ui->line_every == 0)
            printf("step %s\n", text);
        fflush(stdout);
        return;
    }
    if (!done && ui->last_draw >= 0.0 && now_s - ui->last_draw < 0.1)
        return; /* at most ten redraws a second */
    ui->last_draw = now_s;

    /* [=====>    ] sized to what the terminal leaves (8 to 30 wide), then the fields that fit: the line
     * must not wrap, or '\r' would not return to its start */
    int width = terminal_width() - 1;
    int bar = width - (int)strlen(text) - 3;
    bar = bar > 30 ? 30 : bar < 8 ? 8 : bar;
    char line[512];
    int n = 0;
    if (width >= 60) {
        int fill = (int)((double)bar * p->step / ui->total_steps);
        line[n++] = '[';
        for (int i = 0; i < bar; i++)
            line[n++] = i < fill ? '=' : (i == fill ? '>' : ' ');
        line[n++] = ']';
        line[n++] = ' ';
    }
    snprintf(line + n, sizeof line - (size_t)n, "%s", text);
    while ((int)strlen(line) > width) { /* drop the last field (fields are separated by two spaces) */
        char *cut = strstr(line + n + strspn(line + n, " "), "  "); /* not the step counter's padding */
        char *last = NULL;
        for (; cut; cut = strstr(cut + 2, "  "))
            last = cut;
        if (!last) {
            line[width] = '\0';
            break;
        }
        *last = '\0';
    }
    printf("\r%s\033[K", line);
    fflush(stdout);
    ui->bar_shown = 1;
    if (done)
        demo_ui_break(ui);
}

void demo_ui_break(demo_ui *ui)
{
    if (ui->bar_shown) {
        printf("\n");
        ui->bar_shown = 0;
    }
}

void demo_ui_load_table(demo_ui *ui, const char *title, const double *load, int sources, int experts)
{
    if (ui->quiet)
        return;
    demo_ui_break(ui);
    printf("%s\n          ", title);
    for (int e = 0; e < experts; e++) {
        char name[16];
        snprintf(name, sizeof name, "e%d", e);
        printf("  %5s", name);
    }
    printf("\n");
    for (int s = 0; s < sources; s++) {
        double total = 0.0, best = 0.0;
        for (int e = 0; e < experts; e++) {
            total += load[s * experts + e];
            best = load[s * experts + e] > best ? load[s * experts + e] : best;
        }
        printf("  source %d", s);
        for (int e = 0; e < experts; e++) {
            double v = load[s * experts + e];
            double pct = total > 0.0 ? 100.0 * v / total : 0.0;
            /* bold on a terminal for the source's favourite expert */
            if (ui->tty && v == best && v > 0.0)
                printf("  \033[1m%4.0f%%\033[0m", pct);
            else
                printf("  %4.0f%%", pct);
        }
        printf("\n");
    }
    printf("  specialisation I(source; expert) / H(source) = %.2f\n",
           demo_routing_specialisation(load, sources, experts));
    fflush(stdout);
}
