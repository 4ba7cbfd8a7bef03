package moe_test

import (
	"fmt"
	"log"

	"libmoe.dev/moe"
)

// A layer's forward and backward on 4 tokens (the README's example).
func Example() {
	ctx, err := moe.NewContext(nil) // CPU, all cores, built-in allocator
	check(err)
	defer ctx.Close()
	cfg := moe.NewLayerConfig()
	cfg.HiddenSize, cfg.FFNHiddenSize, cfg.NumExperts, cfg.TopK = 8, 16, 4, 2
	layer, err := moe.NewLayer(ctx, cfg)
	check(err)
	defer layer.Close()
	step, err := moe.NewStep(layer, nil) // a training step: keeps the tape for backward
	check(err)
	defer step.Close()
	x, y, dx := make([]float32, 4*8), make([]float32, 4*8), make([]float32, 4*8)
	for i := range x {
		x[i] = float32(i%5) - 2
	}
	check(layer.Forward(step, moe.Float32(x, 4, 8), moe.Float32(y, 4, 8)))
	check(layer.Backward(step, moe.Float32(y, 4, 8), moe.Float32(dx, 4, 8))) // dy = y
	stats, err := step.RoutingStats()
	check(err)
	fmt.Println(stats.NumTokens, "tokens,", stats.NumAssignments, "expert assignments")
	// Output: 4 tokens, 8 expert assignments
}

func check(err error) {
	if err != nil {
		log.Fatal(err) // err is a *moe.Error: status and the library's message
	}
}
