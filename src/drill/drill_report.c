/* drill_report.c - what the drill leaves behind: report.json for
 * machines, report.md for people (tables: verdicts, scenarios and their
 * checks, one row per request), and timeline.svg, each request a bar
 * across time coloured by the worker that ran each part, with the
 * failure, failover, cancel, kill and memory marks.
 *
 * The SVG is written by hand (no library) and its elements carry the data
 * as attributes (data-request-id, data-worker, data-event, ...), so a
 * test or a script can check the picture against report.json.
 */
#include "drill/drill_impl.h"

#include "common/alloc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double rel(const drill *d, double t)
{
    return t > 0 ? t - d->t_start : 0.0;
}

static json_t *num_or_null(const drill *d, double t)
{
    return t > 0 ? json_real(round(rel(d, t) * 1000.0) / 1000.0) : json_null();
}

static const char *request_decision(const dr_request *r)
{
    if (r->has_event)
        return r->decision;
    if (r->status == 503)
        return "refused";
    return "none";
}

static json_t *request_json(const drill *d, const dr_request *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "scenario", json_string(r->scenario));
    json_object_set_new(o, "label", json_string(r->label));
    json_object_set_new(o, "path", json_string(r->path));
    json_object_set_new(o, "stream", json_boolean(r->stream));
    json_object_set_new(o, "job", json_boolean(r->job));
    json_object_set_new(o, "max_tokens", json_integer(r->max_tokens));
    json_object_set_new(o, "status", json_integer(r->status));
    json_object_set_new(o, "error_code", r->error_code[0] ? json_string(r->error_code) : json_null());
    json_object_set_new(o, "worker", json_string(r->worker));
    json_object_set_new(o, "final_worker", json_string(r->final_worker));
    json_object_set_new(o, "attempts", json_integer(r->has_event && r->ev_attempts > r->attempts
                                                        ? r->ev_attempts
                                                        : r->attempts));
    json_object_set_new(o, "request_id_out", json_string(r->rid_out));
    json_object_set_new(o, "request_id_preserved",
                        json_boolean(!strcmp(r->rid_out, r->id) && r->ids_match));
    json_object_set_new(o, "client_connection_open", json_boolean(r->connection_open));
    json_object_set_new(o, "client_cancelled", json_boolean(r->client_cancelled));
    json_object_set_new(o, "timed_out", json_boolean(r->timed_out));
    /* times relative to the start of the drill, seconds */
    json_object_set_new(o, "t_send", num_or_null(d, r->t_send));
    json_object_set_new(o, "t_headers", num_or_null(d, r->t_headers));
    json_object_set_new(o, "t_first_token", num_or_null(d, r->t_first_token));
    json_object_set_new(o, "t_end", num_or_null(d, r->t_end));
    json_t *fe = json_null();
    if (r->has_event) {
        fe = json_object();
        json_object_set_new(fe, "worker", json_string(r->fe_worker));
        json_object_set_new(fe, "kind", json_string(r->fe_kind));
        json_object_set_new(fe, "phase", json_string(r->fe_phase));
        json_object_set_new(fe, "time", num_or_null(d, r->fe_time));
    }
    json_object_set_new(o, "first_error", fe);
    json_object_set_new(o, "retry_decision", json_string(request_decision(r)));
    json_object_set_new(o, "retry_reason", json_string(r->reason));
    json_object_set_new(o, "cpu_start_time", num_or_null(d, r->cpu_start_time));
    json_object_set_new(o, "completion_time", num_or_null(d, r->completion_time));
    json_object_set_new(o, "outcome", json_string(r->has_event ? r->outcome
                                                  : r->client_cancelled ? "cancelled"
                                                  : r->status == 200   ? "completed"
                                                                       : "failed"));
    json_object_set_new(o, "event_client_connected",
                        r->ev_client_connected < 0 ? json_null()
                                                   : json_boolean(r->ev_client_connected));
    json_t *out = json_object();
    json_object_set_new(out, "tokens", json_integer(r->n_tokens));
    json_object_set_new(out, "finish_reason", json_string(r->finish));
    json_object_set_new(out, "text", json_string(r->text));
    json_object_set_new(out, "matches_reference",
                        r->ref_match < 0 ? json_null() : json_boolean(r->ref_match));
    json_object_set_new(o, "final_output", out);
    if (r->job) {
        json_object_set_new(o, "job_id", json_string(r->job_id));
        json_object_set_new(o, "job_state", json_string(r->job_state));
    }
    if (r->tool_steps) {
        json_object_set_new(o, "tool_steps", json_integer(r->tool_steps));
        json_object_set_new(o, "tool_steps_reused", json_integer(r->tool_steps_reused));
    }
    json_object_set_new(o, "ok", json_boolean(r->ok));
    return o;
}

static int write_json(drill *d, const char *path)
{
    json_t *root = json_object();
    json_object_set_new(root, "tool", json_string("spillway drill"));
    json_object_set_new(root, "started_unix", json_real(d->t_start));
    json_object_set_new(root, "duration_s", json_real(round((d->t_end - d->t_start) * 1000) / 1000));
    json_object_set_new(root, "mode", json_string(d->attached ? "attached" : "managed"));
    json_object_set_new(root, "quick", json_boolean(d->quick));
    json_t *setup = json_object();
    json_object_set_new(setup, "router", json_string(d->attached ? d->router_url : "managed"));
    json_object_set_new(setup, "gpu_device", json_string(d->gpu_device));
    json_object_set_new(setup, "gpu_simulated", json_boolean(d->gpu_simulated));
    json_object_set_new(setup, "model", json_string(d->model));
    json_object_set_new(setup, "sabotage", json_string(d->sabotage));
    /* what the router itself says is switched off (null: it does not say) */
    json_object_set_new(setup, "router_sabotage",
                        d->router_sabotage_seen ? json_string(d->router_sabotage) : json_null());
    json_object_set_new(root, "setup", setup);
    json_t *verdicts = json_array();
    for (int v = 0; v < DR_V_COUNT; v++) {
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(dr_verdict_name((dr_verdict_id)v)));
        json_object_set_new(o, "status", json_string(dr_verdict_status(d, (dr_verdict_id)v)));
        json_t *ev = json_array();
        for (int i = 0; i < DR_N_SCENARIOS; i++)
            for (int k = 0; k < d->scenarios[i].n_checks; k++) {
                const dr_check *c = &d->scenarios[i].checks[k];
                if (c->verdict != v)
                    continue;
                json_t *e = json_object();
                json_object_set_new(e, "scenario", json_string(d->scenarios[i].id));
                json_object_set_new(e, "check", json_string(c->name));
                json_object_set_new(e, "passed", json_boolean(c->passed));
                json_object_set_new(e, "detail", json_string(c->detail));
                json_array_append_new(ev, e);
            }
        json_object_set_new(o, "evidence", ev);
        json_array_append_new(verdicts, o);
    }
    json_object_set_new(root, "verdicts", verdicts);
    json_t *scen = json_array();
    for (int i = 0; i < DR_N_SCENARIOS; i++) {
        const dr_scenario *s = &d->scenarios[i];
        json_t *o = json_object();
        json_object_set_new(o, "id", json_string(s->id));
        json_object_set_new(o, "title", json_string(s->title));
        json_object_set_new(o, "property", json_string(s->property));
        json_object_set_new(o, "status", json_string(dr_state_name(s->state)));
        json_object_set_new(o, "note", s->skip_reason[0] ? json_string(s->skip_reason) : json_null());
        json_t *checks = json_array();
        for (int k = 0; k < s->n_checks; k++) {
            const dr_check *c = &s->checks[k];
            json_t *e = json_object();
            json_object_set_new(e, "name", json_string(c->name));
            json_object_set_new(e, "passed", json_boolean(c->passed));
            json_object_set_new(e, "detail", json_string(c->detail));
            json_object_set_new(e, "verdict", c->verdict == DR_V_NONE
                                                  ? json_null()
                                                  : json_string(dr_verdict_name(c->verdict)));
            json_array_append_new(checks, e);
        }
        json_object_set_new(o, "checks", checks);
        json_t *ids = json_array();
        for (int r = 0; r < d->n_requests; r++)
            if (!strcmp(d->requests[r].scenario, s->id))
                json_array_append_new(ids, json_string(d->requests[r].id));
        json_object_set_new(o, "requests", ids);
        json_array_append_new(scen, o);
    }
    json_object_set_new(root, "scenarios", scen);
    json_t *reqs = json_array();
    for (int r = 0; r < d->n_requests; r++)
        json_array_append_new(reqs, request_json(d, &d->requests[r]));
    json_object_set_new(root, "requests", reqs);
    json_t *marks = json_array();
    for (int m = 0; m < d->n_marks; m++) {
        json_t *o = json_object();
        json_object_set_new(o, "time", num_or_null(d, d->marks[m].time));
        json_object_set_new(o, "scenario", json_string(d->marks[m].scenario));
        json_object_set_new(o, "kind", json_string(d->marks[m].kind));
        json_object_set_new(o, "label", json_string(d->marks[m].label));
        json_array_append_new(marks, o);
    }
    json_object_set_new(root, "marks", marks);
    json_object_set_new(root, "passed", json_boolean(dr_all_passed(d) && !dr_interrupted));
    json_object_set_new(root, "interrupted", json_boolean(dr_interrupted != 0));
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return rc;
}

/* Markdown table cells: no pipes or newlines. */
static void md_cell(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", f);
        else if (*s == '\n' || *s == '\r')
            fputc(' ', f);
        else
            fputc(*s, f);
    }
}

static int write_md(drill *d, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    time_t t0 = (time_t)d->t_start;
    struct tm tm;
    gmtime_r(&t0, &tm);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    bool passed = dr_all_passed(d) && !dr_interrupted;
    fprintf(f, "# spillway drill: %s\n\n", dr_interrupted ? "INTERRUPTED" : passed ? "PASSED" : "FAILED");
    fprintf(f, "Run %s, %.1f s, %s; GPU worker `%s`%s; model `%s`.\n", when, d->t_end - d->t_start,
            d->attached ? "attached to a running router" : "routers started by the drill",
            d->gpu_device, d->gpu_simulated ? " (simulated GPU)" : "", d->model);
    if (d->sabotage[0])
        fprintf(f, "\n**SPILLWAY_SABOTAGE=%s was set: the router was broken on purpose.**\n",
                d->sabotage);
    fprintf(f, "\nTimes are seconds from the start of the drill. The timeline is in "
               "[timeline.svg](timeline.svg); every field is in report.json.\n");
    fprintf(f, "\n## Verdicts\n\n| verdict | result | evidence |\n|---|---|---|\n");
    for (int v = 0; v < DR_V_COUNT; v++) {
        int n = 0, bad = 0;
        for (int i = 0; i < DR_N_SCENARIOS; i++)
            for (int k = 0; k < d->scenarios[i].n_checks; k++)
                if (d->scenarios[i].checks[k].verdict == v) {
                    n++;
                    bad += !d->scenarios[i].checks[k].passed;
                }
        fprintf(f, "| %s | **%s** | %d check(s)%s |\n", dr_verdict_name((dr_verdict_id)v),
                dr_verdict_status(d, (dr_verdict_id)v), n, bad ? ", some failed (below)" : "");
    }
    fprintf(f, "\n## Scenarios\n\n| | scenario | proves | result |\n|---|---|---|---|\n");
    for (int i = 0; i < DR_N_SCENARIOS; i++) {
        const dr_scenario *s = &d->scenarios[i];
        fprintf(f, "| %s | ", s->id);
        md_cell(f, s->title);
        fprintf(f, " | ");
        md_cell(f, s->property);
        fprintf(f, " | **%s**", dr_state_name(s->state));
        if (s->skip_reason[0]) {
            fprintf(f, ": ");
            md_cell(f, s->skip_reason);
        }
        fprintf(f, " |\n");
    }
    for (int i = 0; i < DR_N_SCENARIOS; i++) {
        const dr_scenario *s = &d->scenarios[i];
        fprintf(f, "\n### %s: %s — %s\n\n", s->id, s->title, dr_state_name(s->state));
        if (s->skip_reason[0])
            fprintf(f, "%s\n\n", s->skip_reason);
        if (s->n_checks) {
            fprintf(f, "| check | result | detail | verdict |\n|---|---|---|---|\n");
            for (int k = 0; k < s->n_checks; k++) {
                const dr_check *c = &s->checks[k];
                fprintf(f, "| ");
                md_cell(f, c->name);
                fprintf(f, " | %s | ", c->passed ? "pass" : "**FAIL**");
                md_cell(f, c->detail);
                fprintf(f, " | %s |\n", c->verdict == DR_V_NONE ? "" : dr_verdict_name(c->verdict));
            }
        }
        bool any = false;
        for (int r = 0; r < d->n_requests; r++) {
            const dr_request *q = &d->requests[r];
            if (strcmp(q->scenario, s->id))
                continue;
            if (!any) {
                fprintf(f, "\n| request | what | status | first error | decision | CPU start "
                           "| end | worker(s) | attempts | tokens | output = reference | "
                           "connection open | id kept |\n"
                           "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
                any = true;
            }
            char fe[160] = "–", cpu[32] = "–", end[32] = "–", workers[80];
            if (q->has_event)
                snprintf(fe, sizeof fe, "%s %s %s at %.3f", q->fe_worker, q->fe_kind, q->fe_phase,
                         rel(d, q->fe_time));
            if (q->cpu_start_time > 0)
                snprintf(cpu, sizeof cpu, "%.3f", rel(d, q->cpu_start_time));
            if (q->t_end > 0)
                snprintf(end, sizeof end, "%.3f", rel(d, q->t_end));
            if (q->has_event && q->replay_worker[0])
                snprintf(workers, sizeof workers, "%s → %s", q->fe_worker, q->replay_worker);
            else if (q->has_event && q->status == 200 && q->final_worker[0])
                snprintf(workers, sizeof workers, "%s → %s", q->fe_worker, q->final_worker);
            else if (q->has_event)
                snprintf(workers, sizeof workers, "%s → (%s)", q->fe_worker,
                         q->client_cancelled ? "cancelled" : "failed");
            else
                snprintf(workers, sizeof workers, "%s", q->final_worker[0] ? q->final_worker : "–");
            char status[96];
            snprintf(status, sizeof status, "%d%s%s%s", q->status, q->error_code[0] ? " " : "",
                     q->error_code, q->client_cancelled ? " (client hung up)" : "");
            fprintf(f, "| `%s` | ", q->id);
            md_cell(f, q->label);
            fprintf(f, " | %s | %s | %s | %s | %s | %s | %d | %d | %s | %s | %s |\n", status, fe,
                    request_decision(q), cpu, end, workers,
                    q->has_event && q->ev_attempts > q->attempts ? q->ev_attempts : q->attempts,
                    q->n_tokens,
                    q->ref_match < 0 ? "–" : q->ref_match ? "yes" : "**no**",
                    q->connection_open ? "yes" : "**no**",
                    !strcmp(q->rid_out, q->id) && q->ids_match ? "yes" : "**no**");
        }
        bool marks = false;
        for (int m = 0; m < d->n_marks; m++) {
            if (strcmp(d->marks[m].scenario, s->id))
                continue;
            if (!marks)
                fprintf(f, "\nWhat the drill did:\n\n");
            marks = true;
            fprintf(f, "- %.3f s: %s\n", rel(d, d->marks[m].time), d->marks[m].label);
        }
    }
    fprintf(f, "\n## How to read this\n\nSee docs/drill.md: what each scenario and verdict "
               "means, and how to rerun one scenario by hand from the configuration in "
               "`run/<scenario>/router.ini`.\n");
    int rc = ferror(f) ? -1 : 0;
    if (fclose(f))
        rc = -1;
    return rc;
}

/* ---- timeline.svg -------------------------------------------------------------- */

static const char *worker_color(const char *w)
{
    if (!strcmp(w, "gpu"))
        return "#2b7bd6";
    if (!strcmp(w, "cpu"))
        return "#e08a1e";
    return "#9a9a9a";
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t')
                fputc(*s, f);
        }
    }
}

typedef struct svg_geo {
    double x0, width;   /* plot area */
    double t_min, t_max;
} svg_geo;

static double sx(const svg_geo *g, double t)
{
    double span = g->t_max - g->t_min;
    if (span <= 0)
        span = 1;
    double x = g->x0 + (t - g->t_min) / span * g->width;
    if (x < g->x0)
        x = g->x0;
    if (x > g->x0 + g->width)
        x = g->x0 + g->width;
    return x;
}

static void segment(FILE *f, const svg_geo *g, const dr_request *q, const char *worker,
                    const char *part, double t_a, double t_b, double y, double h)
{
    double xa = sx(g, t_a), xb = sx(g, t_b);
    if (xb - xa < 1.5)
        xb = xa + 1.5;
    fprintf(f, "<rect class=\"segment\" data-request-id=\"");
    xml_text(f, q->id);
    fprintf(f, "\" data-worker=\"%s\" data-part=\"%s\" data-start=\"%.3f\" data-end=\"%.3f\" "
               "x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" rx=\"2\"/>\n",
            worker, part, t_a - g->t_min, t_b - g->t_min, xa, y, xb - xa, h, worker_color(worker));
}

static void marker(FILE *f, const svg_geo *g, const char *id, const char *event, double t, double y,
                   const char *title)
{
    double x = sx(g, t);
    fprintf(f, "<g class=\"marker\" data-request-id=\"");
    xml_text(f, id);
    fprintf(f, "\" data-event=\"%s\" data-time=\"%.3f\">", event, t - g->t_min);
    if (!strcmp(event, "failure"))
        fprintf(f, "<path d=\"M%.1f %.1f l8 8 M%.1f %.1f l-8 8\" stroke=\"#d11\" stroke-width=\"2.5\"/>",
                x - 4, y - 4, x + 4, y - 4);
    else if (!strcmp(event, "failover"))
        fprintf(f, "<path d=\"M%.1f %.1f l9 5 l-9 5 z\" fill=\"#1a9a3a\"/>", x, y - 5);
    else if (!strcmp(event, "cancel"))
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"8\" height=\"8\" fill=\"none\" "
                   "stroke=\"#222\" stroke-width=\"2\"/>", x - 4, y - 4);
    else if (!strcmp(event, "error"))
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"#d11\"/>", x, y);
    else
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#222\"/>", x, y);
    fprintf(f, "<title>");
    xml_text(f, title);
    fprintf(f, "</title></g>\n");
}

static int write_svg(drill *d, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    const double row_h = 16, label_w = 230, width = 1100, top = 60;
    svg_geo g = {.x0 = label_w + 10, .width = width - label_w - 30, .t_min = d->t_start,
                 .t_max = d->t_end > d->t_start ? d->t_end : d->t_start + 1};
    int rows = d->n_requests;
    int n_sc = 0;
    for (int i = 0; i < DR_N_SCENARIOS; i++)
        n_sc += d->scenarios[i].state != DR_NOT_RUN;
    double height = top + rows * row_h + n_sc * 22 + 150;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\" "
               "data-duration=\"%.3f\">\n",
            width, height, width, height, g.t_max - g.t_min);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", width,
            height);
    fprintf(f, "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">spillway drill: "
               "%s, %.1f s</text>\n",
            dr_all_passed(d) && !dr_interrupted ? "passed" : "FAILED", g.t_max - g.t_min);
    fprintf(f, "<text x=\"10\" y=\"40\" fill=\"#555\">each request a bar across time, "
               "coloured by the worker running it; GPU worker ");
    xml_text(f, d->gpu_device);
    fprintf(f, "</text>\n");
    /* time axis */
    double span = g.t_max - g.t_min, step = 1;
    while (span / step > 12)
        step *= span / step > 60 ? 10 : 2;
    double axis_y = top + rows * row_h + n_sc * 22 + 10;
    fprintf(f, "<g class=\"axis\" stroke=\"#ddd\">\n");
    for (double t = 0; t <= span + 1e-9; t += step) {
        double x = sx(&g, g.t_min + t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, top - 8, x, axis_y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\" stroke=\"none\" "
                   "text-anchor=\"middle\">%gs</text>\n", x, axis_y + 14, t);
    }
    fprintf(f, "</g>\n");
    double y = top;
    for (int i = 0; i < DR_N_SCENARIOS; i++) {
        const dr_scenario *s = &d->scenarios[i];
        if (s->state == DR_NOT_RUN)
            continue;
        fprintf(f, "<g class=\"scenario\" data-scenario=\"%s\" data-status=\"%s\">\n", s->id,
                dr_state_name(s->state));
        fprintf(f, "<text x=\"10\" y=\"%.1f\" font-weight=\"bold\" fill=\"%s\">", y + 12,
                s->state == DR_FAILED ? "#d11" : "#222");
        fprintf(f, "%s ", s->id);
        xml_text(f, s->title);
        fprintf(f, " — %s</text>\n", dr_state_name(s->state));
        y += 22;
        for (int m = 0; m < d->n_marks; m++) {
            const dr_mark *mk = &d->marks[m];
            if (strcmp(mk->scenario, s->id))
                continue;
            double x = sx(&g, mk->time);
            fprintf(f, "<g class=\"action\" data-event=\"%s\" data-time=\"%.3f\" "
                       "data-scenario=\"%s\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                       "y2=\"%.1f\" stroke=\"#7a3db8\" stroke-dasharray=\"3 2\"/><title>",
                    mk->kind, mk->time - g.t_min, s->id, x, y - 8, x, y + 4);
            xml_text(f, mk->label);
            fprintf(f, "</title></g>\n");
        }
        for (int r = 0; r < d->n_requests; r++) {
            const dr_request *q = &d->requests[r];
            if (strcmp(q->scenario, s->id))
                continue;
            double by = y + 3, bh = row_h - 6;
            fprintf(f, "<g class=\"request\" data-request-id=\"");
            xml_text(f, q->id);
            fprintf(f, "\" data-worker=\"%s\" data-scenario=\"%s\" data-status=\"%d\" "
                       "data-attempts=\"%d\" data-decision=\"%s\" data-ok=\"%s\">\n",
                    q->final_worker[0] ? q->final_worker : "none", q->scenario, q->status,
                    q->has_event && q->ev_attempts > q->attempts ? q->ev_attempts : q->attempts,
                    request_decision(q), q->ok ? "true" : "false");
            fprintf(f, "<title>");
            xml_text(f, q->id);
            fprintf(f, ": ");
            xml_text(f, q->label);
            fprintf(f, "</title>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">",
                    label_w, y + row_h - 4, q->ok ? "#333" : "#d11");
            xml_text(f, q->id);
            fprintf(f, "</text>\n");
            double t_a = q->t_send > 0 ? q->t_send : d->t_start;
            double t_b = q->t_end > t_a ? q->t_end : t_a;
            if (q->has_event && q->fe_time > 0) {
                segment(f, &g, q, q->fe_worker[0] ? q->fe_worker : "gpu", "first", t_a,
                        q->fe_time > t_a ? q->fe_time : t_a, by, bh);
                double cs = q->cpu_start_time > 0 ? q->cpu_start_time : q->fe_time;
                if (cs > q->fe_time)
                    segment(f, &g, q, "none", "gap", q->fe_time, cs, by + bh / 2 - 1, 2);
                if (q->replay_worker[0] || q->cpu_start_time > 0)
                    segment(f, &g, q, q->replay_worker[0] ? q->replay_worker : "cpu", "replay", cs,
                            t_b > cs ? t_b : cs, by, bh);
                else if (q->status == 200 && q->final_worker[0] && t_b > cs)
                    /* replayed above the failed attempt (an agent run starts over): the
                     * record has no start time, the answer names the worker */
                    segment(f, &g, q, q->final_worker, "replay", cs, t_b, by, bh);
                marker(f, &g, q->id, "failure", q->fe_time, by + bh / 2,
                       "first error on the GPU worker");
                if (q->cpu_start_time > 0)
                    marker(f, &g, q->id, "failover", q->cpu_start_time, by + bh / 2,
                           "failover: the next attempt starts");
            } else {
                segment(f, &g, q, q->final_worker[0] ? q->final_worker : "none", "whole", t_a, t_b,
                        by, bh);
            }
            if (q->client_cancelled)
                marker(f, &g, q->id, "cancel", t_b, by + bh / 2, "the client hung up");
            else if (q->status != 200)
                marker(f, &g, q->id, "error", t_b, by + bh / 2,
                       q->error_code[0] ? q->error_code : "no answer");
            if (q->t_first_token > 0 && q->stream)
                marker(f, &g, q->id, "first-token", q->t_first_token, by + bh / 2,
                       "first token at the client");
            fprintf(f, "</g>\n");
            y += row_h;
        }
        fprintf(f, "</g>\n");
    }
    /* legend */
    double ly = axis_y + 36;
    fprintf(f, "<g class=\"legend\">\n");
    static const char *const names[3] = {"gpu", "cpu", "none"};
    static const char *const labels[3] = {"GPU worker", "CPU worker", "no worker (refused, gap)"};
    double lx = 10;
    for (int i = 0; i < 3; i++) {
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"10\" fill=\"%s\" "
                   "data-legend=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                lx, ly, worker_color(names[i]), names[i], lx + 18, ly + 9, labels[i]);
        lx += 170;
    }
    ly += 22;
    lx = 10;
    svg_geo legend_geo = {.x0 = 0, .width = width, .t_min = 0, .t_max = width};
    static const char *const evs[5] = {"failure", "failover", "cancel", "error", "first-token"};
    static const char *const evl[5] = {"first error", "next attempt starts", "client hung up",
                                       "typed error / no answer", "first token (streams)"};
    for (int i = 0; i < 5; i++) {
        marker(f, &legend_geo, "legend", evs[i], lx + 6, ly + 5, evl[i]);
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", lx + 18, ly + 9, evl[i]);
        lx += 175;
    }
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#7a3db8\" "
               "stroke-dasharray=\"3 2\"/><text x=\"%.0f\" y=\"%.0f\">what the drill did "
               "(kill, second model, hang-up, tool call)</text>\n",
            10.0, ly + 28, 24.0, ly + 28, 30.0, ly + 32);
    fprintf(f, "</g>\n</svg>\n");
    int rc = ferror(f) ? -1 : 0;
    if (fclose(f))
        rc = -1;
    return rc;
}

int dr_write_reports(drill *d)
{
    char path[700];
    int rc = 0;
    if (d->t_end <= 0)
        d->t_end = dh_now();
    snprintf(path, sizeof path, "%s/report.json", d->out_dir);
    rc |= write_json(d, path);
    snprintf(path, sizeof path, "%s/report.md", d->out_dir);
    rc |= write_md(d, path);
    snprintf(path, sizeof path, "%s/timeline.svg", d->out_dir);
    rc |= write_svg(d, path);
    return rc ? -1 : 0;
}
