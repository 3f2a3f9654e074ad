package protocol

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

// cleanEachByte is appendClean as a plain loop over every byte: the
// reference appendClean must agree with, and the base of its benchmark.
func cleanEachByte(dst, b []byte) []byte {
	start := len(dst)
	dst = append(dst, b...)
	for i := start; i < len(dst); i++ {
		if c := dst[i]; c < 0x20 || c == 0x7f {
			dst[i] = ' '
		}
	}
	return dst
}

func TestAppendCleanAgreesWithAByteLoop(t *testing.T) {
	t.Run("every byte value at every place of a word and its tail", func(t *testing.T) {
		for n := 1; n <= 17; n++ {
			for at := range n {
				for v := range 256 {
					b := []byte("ABCDEFGHIJKLMNOPQ")[:n]
					b[at] = byte(v)
					assert.Equal(t, cleanEachByte([]byte("x|"), b), appendClean([]byte("x|"), b), "n=%d at=%d v=%#x", n, at, v)
				}
			}
		}
	})
	t.Run("random bytes", func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for range 20000 {
			b := make([]byte, r.IntN(80))
			for i := range b {
				b[i] = byte(r.IntN(256))
			}
			assert.Equal(t, cleanEachByte(nil, b), appendClean(nil, b))
		}
	})
	t.Run("a string", func(t *testing.T) {
		assert.Equal(t, "bad line ", string(appendClean(nil, "bad\tline\x7f")))
	})
}

func TestHasControl(t *testing.T) {
	for v := range 256 {
		for at := range 8 {
			w := uint64(eachByte * 'A')
			w = w&^(0xff<<(8*at)) | uint64(v)<<(8*at)
			assert.Equal(t, v < 0x20 || v == 0x7f, hasControl(w), "byte %#x at %d", v, at)
		}
	}
}

// BenchmarkAppendClean compares appendClean with a loop over every byte,
// in the same run, on a message as a refusal writes it.
func BenchmarkAppendClean(b *testing.B) {
	msg := []byte(MsgBulkheadFull)
	dst := make([]byte, 0, 128)
	b.Run("byte_loop", func(b *testing.B) {
		for b.Loop() {
			dst = cleanEachByte(dst[:0], msg)
		}
	})
	b.Run("word_test", func(b *testing.B) {
		for b.Loop() {
			dst = appendClean(dst[:0], msg)
		}
	})
}
