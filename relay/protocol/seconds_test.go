package protocol

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAppendSecondsIsAppendInt(t *testing.T) {
	for n := int64(-10); n <= 20000; n++ {
		assert.Equal(t, string(strconv.AppendInt([]byte("x"), n, 10)), string(appendSeconds([]byte("x"), n)), "n=%d", n)
	}
	for _, n := range []int64{99999, 1e9, math.MaxInt64, math.MinInt64} {
		assert.Equal(t, strconv.FormatInt(n, 10), string(appendSeconds(nil, n)), "n=%d", n)
	}
}

// BenchmarkAppendSeconds compares appendSeconds with strconv.AppendInt, in
// the same run, on the hints of the default reset timeout (10 s) and of a
// one-hour one.
func BenchmarkAppendSeconds(b *testing.B) {
	dst := make([]byte, 0, 64)
	for _, n := range []int64{7, 3600} {
		b.Run("strconv/"+strconv.FormatInt(n, 10), func(b *testing.B) {
			for b.Loop() {
				dst = strconv.AppendInt(dst[:0], n, 10)
			}
		})
		b.Run("digits/"+strconv.FormatInt(n, 10), func(b *testing.B) {
			for b.Loop() {
				dst = appendSeconds(dst[:0], n)
			}
		})
	}
}
