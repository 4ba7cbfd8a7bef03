package moe

import (
	"bufio"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The shared reference values of tests/bindings/fixture.c, read from $MOE_FIXTURE.

const (
	fxT, fxH, fxF, fxE, fxK = 6, 8, 16, 4, 2
)

type record struct {
	typ    string
	shape  []int64
	values []float64 // every type, widened (i64 values are small counts and indices)
}

var (
	fixtureOnce sync.Once
	fixtureRecs map[string]record
	fixtureErr  string
)

func parseFixture(path string) (map[string]record, string) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err.Error()
	}
	defer f.Close()
	recs := map[string]record{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if line == 1 {
			if text != "libmoe-fixture 1" {
				return nil, "first line is " + strconv.Quote(text) + ", expected \"libmoe-fixture 1\""
			}
			continue
		}
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		w := strings.Fields(text)
		ndim, err := strconv.Atoi(w[2])
		if err != nil || len(w) < 3+ndim {
			return nil, "line " + strconv.Itoa(line) + ": bad header"
		}
		r := record{typ: w[1]}
		for _, d := range w[3 : 3+ndim] {
			n, _ := strconv.ParseInt(d, 10, 64)
			r.shape = append(r.shape, n)
		}
		for _, v := range w[3+ndim:] {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, "line " + strconv.Itoa(line) + ": " + err.Error()
			}
			r.values = append(r.values, x)
		}
		recs[w[0]] = r
	}
	if err := sc.Err(); err != nil {
		return nil, err.Error()
	}
	return recs, ""
}

// fixture returns the records; a test that needs them fails (never skips) without $MOE_FIXTURE.
func fixture(t *testing.T) map[string]record {
	t.Helper()
	fixtureOnce.Do(func() {
		path := os.Getenv("MOE_FIXTURE")
		if path == "" {
			fixtureErr = "MOE_FIXTURE is not set: run scripts/test-go.sh, or generate the file with " +
				"<build>/tests/bindings/moe_fixture OUT.txt and export MOE_FIXTURE=OUT.txt"
			return
		}
		fixtureRecs, fixtureErr = parseFixture(path)
	})
	if fixtureErr != "" {
		t.Fatalf("fixture: %s", fixtureErr)
	}
	return fixtureRecs
}

func rec(t *testing.T, name string) record {
	t.Helper()
	r, ok := fixture(t)[name]
	if !ok {
		t.Fatalf("fixture has no record %q", name)
	}
	return r
}

func fixF32(t *testing.T, name string) []float32 {
	t.Helper()
	r := rec(t, name)
	out := make([]float32, len(r.values))
	for i, v := range r.values {
		out[i] = float32(v)
	}
	return out
}

func fixI64(t *testing.T, name string) []int64 {
	t.Helper()
	r := rec(t, name)
	out := make([]int64, len(r.values))
	for i, v := range r.values {
		out[i] = int64(v)
	}
	return out
}

func fixScalar(t *testing.T, name string) float64 {
	t.Helper()
	return rec(t, name).values[0]
}

// close enough: |a-b| <= 1e-6 + 1e-6|b| (the binding calls the same library: results are bitwise
// equal, the tolerance only guards against printing round trips)
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6+1e-6*math.Abs(b) }

func expectF32(t *testing.T, what string, got []float32, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if !near(float64(got[i]), float64(want[i])) {
			t.Fatalf("%s[%d] = %.9g, want %.9g", what, i, got[i], want[i])
		}
	}
}

func expectI64(t *testing.T, what string, got, want []int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s[%d] = %d, want %d", what, i, got[i], want[i])
		}
	}
}

// fixtureConfig is the layer the fixture describes.
func fixtureConfig() LayerConfig {
	cfg := NewLayerConfig()
	cfg.HiddenSize, cfg.FFNHiddenSize, cfg.NumExperts, cfg.TopK = fxH, fxF, fxE, fxK
	cfg.Activation = ActSwiGLU
	cfg.ScoreFunction = ScoreSigmoid
	cfg.ExpertBias = true
	cfg.AuxLossType = AuxSwitch
	cfg.AuxLossCoeff = 0.01
	cfg.ZLossCoeff = 0.001
	cfg.ParamDType = DTypeFloat32
	return cfg
}

// importFixtureParams loads params 0, 1, 2 and 6 of the fixture into l.
func importFixtureParams(t *testing.T, l *Layer) {
	t.Helper()
	for _, slot := range []ParamSlot{ParamRouterWeight, ParamExpertFC1, ParamExpertFC2, ParamExpertBias} {
		name := "param." + strconv.Itoa(int(slot))
		if err := l.ImportParam(slot, Float32(fixF32(t, name), rec(t, name).shape...)); err != nil {
			t.Fatalf("ImportParam(%s): %v", name, err)
		}
	}
}

// mustOK fails the test on err.
func mustOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
